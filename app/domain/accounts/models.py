"""Users and their API keys.

Emails are unique regardless of case (a unique index on `lower(email)`), and are stored lower-cased
by the service. Neither a password nor an API key secret is ever stored: passwords as argon2 hashes,
API keys as the SHA-256 of the secret (the secret is random and long, so a slow hash buys nothing,
and a fast one lets each request look its key up by an indexed equality).
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from sqlalchemy import ForeignKey, Index, String, func
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, CreatedAt, UUIDPrimaryKey


class User(UUIDPrimaryKey, CreatedAt, Base):
    __tablename__ = "users"

    email: Mapped[str] = mapped_column(String(320))
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    # TRUE only for the account made admin by signing up first, NULL for all others: a unique
    # index admits one TRUE, so racing first sign-ups cannot both become admin (migration 0004).
    first_admin: Mapped[bool | None] = mapped_column(default=None)

    def __repr__(self) -> str:
        return f"User(id={self.id}, email={self.email!r}, is_admin={self.is_admin})"


Index("uq_users_email_lower", func.lower(User.email), unique=True)
Index("uq_users_first_admin", User.first_admin, unique=True)


class ApiKey(UUIDPrimaryKey, CreatedAt, Base):
    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_user_id", "user_id"),)

    user_id: Mapped[UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(32))  # the secret's first characters, for lists
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def __repr__(self) -> str:
        return f"ApiKey(id={self.id}, user_id={self.user_id}, prefix={self.prefix!r})"
