"""The declarative base every model shares, and the one clock they use.

advanced-alchemy's `DefaultBase` brings what we want and nothing more: a constraint naming
convention (so Alembic can name, and later drop, every index and constraint), and a type map under
which `Mapped[UUID]` is native UUID on PostgreSQL and 16 bytes on SQLite, and `Mapped[datetime]` is a
timezone-aware UTC timestamp on both. Its UUID/audit bases are not used: they add a sentinel column
and an `updated_at` to every table, which our tables do not need.
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from advanced_alchemy.base import DefaultBase
from sqlalchemy.orm import Mapped, mapped_column

__all__ = ("Base", "CreatedAt", "UUIDPrimaryKey", "utcnow")


def utcnow() -> datetime:
    """Now, timezone-aware, in UTC: the only kind of timestamp stored."""
    return datetime.now(UTC)


class Base(DefaultBase):
    """Base class of every model; `Base.metadata` is the schema Alembic migrates."""

    __abstract__ = True


class UUIDPrimaryKey:
    """A random UUID primary key: ids in URLs reveal nothing about how many rows exist."""

    id: Mapped[UUID] = mapped_column(primary_key=True, default=uuid4, sort_order=-100)


class CreatedAt:
    created_at: Mapped[datetime] = mapped_column(default=utcnow, sort_order=100)
