"""Conversations can be pinned (first in the list) and archived (out of it, kept).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

Two nullable timestamps on `conversations`, NULL for every existing row (neither pinned nor
archived); `pinned_at` orders the pinned ones, newest pin first. No data moves either way.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import DateTimeUTC
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("pinned_at", DateTimeUTC(timezone=True), nullable=True))
        batch.add_column(sa.Column("archived_at", DateTimeUTC(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("archived_at")
        batch.drop_column("pinned_at")
