"""Token quotas: each user's overrides of the default limits, and a token counter per user per day.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

The overrides are NULL for every existing account (they follow QUOTA_TOKENS_PER_DAY and
QUOTA_TOKENS_PER_MONTH). The counter starts empty: use from before this migration is not counted.
On SQLite the batch copy of `users` drops the expression index on lower(email), which is made
again (as in 0008).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _restore_email_index() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("CREATE UNIQUE INDEX IF NOT EXISTS uq_users_email_lower ON users (lower(email))")


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("quota_tokens_per_day", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("quota_tokens_per_month", sa.Integer(), nullable=True))
    _restore_email_index()
    op.create_table(
        "quota_usage",
        sa.Column("user_id", GUID(length=16), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_quota_usage_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", "day", name=op.f("pk_quota_usage")),
    )


def downgrade() -> None:
    op.drop_table("quota_usage")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("quota_tokens_per_month")
        batch.drop_column("quota_tokens_per_day")
    _restore_email_index()
