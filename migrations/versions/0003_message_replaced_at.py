"""Regenerated replies are replaced, not deleted.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

Regenerate answers the same question again: the new reply takes the old one's place in the chat
and in later prompts, while the old row stays (with `replaced_at` set) for the admin's history.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import DateTimeUTC
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("replaced_at", DateTimeUTC(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("replaced_at")
