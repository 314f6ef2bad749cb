"""The token counter: one row per user per UTC day, tokens used (and reserved) that day.

A month's use is the sum of its days' rows (31 at most, read by the primary key's prefix), so a
quota check is one cheap read and a reservation one conditional UPDATE of one row. A row goes
with its user (ON DELETE CASCADE).
"""

from __future__ import annotations

from datetime import date
from uuid import UUID

from sqlalchemy import BigInteger, Date, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base


class QuotaUsage(Base):
    __tablename__ = "quota_usage"

    user_id: Mapped[UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[date] = mapped_column(Date, primary_key=True)  # UTC
    # prompt + completion tokens of the replies started that day, as the engine reported them,
    # plus what the replies still running have reserved (their max, settled at their end)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
