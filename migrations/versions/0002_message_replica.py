"""Which replica runs a reply, so a restarting replica only closes its own leftovers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

With several app processes sharing one database, a replica that restarts must mark as
`interrupted` only the replies IT left `streaming`, not the live replies of its siblings.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("replica_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("replica_id")
