"""A user's logged-in browsers, listed on their account page and ended one by one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

Sessions made before this revision have no row: they stay valid (unlisted) until they end.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "account_sessions",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("user_id", GUID(length=16), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("user_agent", sa.String(length=300), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("last_seen_at", DateTimeUTC(timezone=True), nullable=False),
        sa.Column("created_at", DateTimeUTC(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_account_sessions_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_account_sessions")),
    )
    op.create_index("ix_account_sessions_user_id", "account_sessions", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_account_sessions_user_id", table_name="account_sessions")
    op.drop_table("account_sessions")
