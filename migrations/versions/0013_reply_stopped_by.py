"""Who stopped a cancelled reply (the user, an admin, or a sign-out), for the page to say so.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

Replies cancelled before this revision have none: the page says only that the reply stopped.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("stopped_by", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("stopped_by")
