"""Users, their API keys, their logged-in browsers, one-time account links, and the audit log.

Emails are unique regardless of case (a unique index on `lower(email)`), and are stored lower-cased
by the service. Neither a password nor an API key secret is ever stored: passwords as argon2 hashes,
API keys as the SHA-256 of the secret (the secret is random and long, so a slow hash buys nothing,
and a fast one lets each request look its key up by an indexed equality).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from sqlalchemy import Enum, ForeignKey, Index, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, CreatedAt, UUIDPrimaryKey, utcnow


class UserState(StrEnum):
    ACTIVE = "active"
    PENDING = "pending"  # signed up under SIGNUP_MODE=approval: waits for an admin
    DISABLED = "disabled"  # an admin switched the account off: no log-in, no API key


class TokenKind(StrEnum):
    INVITE = "invite"  # signs one new account up (SIGNUP_MODE=invite)
    RESET = "reset"  # sets one user's password, once


def _str_enum(enum: type[StrEnum], name: str) -> Enum:
    """A VARCHAR holding the enum's values, guarded by a named CHECK constraint (as in chat)."""
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class User(UUIDPrimaryKey, CreatedAt, Base):
    __tablename__ = "users"

    email: Mapped[str] = mapped_column(String(320))
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    # TRUE only for the account made admin by signing up first, NULL for all others: a unique
    # index admits one TRUE, so racing first sign-ups cannot both become admin (migration 0004).
    first_admin: Mapped[bool | None] = mapped_column(default=None)
    state: Mapped[UserState] = mapped_column(
        _str_enum(UserState, "user_state"), default=UserState.ACTIVE, server_default="active"
    )
    # Raised to end every session of the user at once: a session remembers the epoch it was
    # made in, and one from an older epoch is dropped (app/domain/accounts/access.py).
    session_epoch: Mapped[int] = mapped_column(default=0, server_default="0")
    last_seen_at: Mapped[datetime | None] = mapped_column(default=None)
    # Token quotas (app/domain/quotas/): None follows QUOTA_TOKENS_PER_DAY / _MONTH, 0 is no limit
    quota_tokens_per_day: Mapped[int | None] = mapped_column(default=None)
    quota_tokens_per_month: Mapped[int | None] = mapped_column(default=None)

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


class BrowserSession(UUIDPrimaryKey, CreatedAt, Base):
    """One logged-in browser, so that a user can list theirs and end one of them. The server-side
    session holds this row's id (app/domain/accounts/browser_sessions.py); the session store's own
    key (the cookie) is never written here, so a database leak logs nobody in. A session whose row
    is gone is dropped on its next request; rows of an older `epoch` than the account's are dead
    (ended by "log out everywhere", a password change or reset) and are not listed."""

    __tablename__ = "account_sessions"
    __table_args__ = (Index("ix_account_sessions_user_id", "user_id"),)

    user_id: Mapped[UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(default=0)
    user_agent: Mapped[str] = mapped_column(String(300), default="")
    address: Mapped[str] = mapped_column(String(64), default="")
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class AccountToken(UUIDPrimaryKey, CreatedAt, Base):
    """A one-time link: an invitation (optionally for one email) or a password reset (for one
    user). Only the SHA-256 of its secret is kept, as for API keys."""

    __tablename__ = "account_tokens"
    __table_args__ = (Index("ix_account_tokens_user_id", "user_id"),)

    kind: Mapped[TokenKind] = mapped_column(_str_enum(TokenKind, "account_token_kind"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(320), default=None)  # invite: only for it
    user_id: Mapped[UUID | None] = mapped_column(  # reset: whose password
        ForeignKey("users.id", ondelete="CASCADE"), default=None
    )
    created_by: Mapped[UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), default=None
    )
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(default=None)


class AuditEntry(UUIDPrimaryKey, CreatedAt, Base):
    """One admin action. Append-only: nothing in the app updates or deletes a row. User ids are
    plain columns, not foreign keys, so entries outlive the accounts they name."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_created_at", "created_at"),
        Index("ix_audit_log_target_id", "target_id"),
    )

    actor_id: Mapped[UUID | None] = mapped_column(default=None)  # None: the command line
    actor_email: Mapped[str] = mapped_column(String(320))
    action: Mapped[str] = mapped_column(String(40))
    target_id: Mapped[UUID | None] = mapped_column(default=None)
    target_email: Mapped[str | None] = mapped_column(String(320), default=None)
    detail: Mapped[str] = mapped_column(Text, default="")
    address: Mapped[str] = mapped_column(String(64), default="")
