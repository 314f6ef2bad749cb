"""Running it for a team: account states, session epochs, one-time links, the audit log.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Existing accounts stay `active`. On SQLite the batch copy of `users` (a CHECK constraint needs a new
table) cannot carry the expression index on lower(email), which SQLAlchemy does not reflect: it is
made again after each copy. `audit_log` names users by plain id columns (no foreign key), so
deleting a user keeps the entries about them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def _restore_email_index() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("CREATE UNIQUE INDEX IF NOT EXISTS uq_users_email_lower ON users (lower(email))")


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(
            sa.Column(
                "state",
                _enum("user_state", "active", "pending", "disabled"),
                server_default="active",
                nullable=False,
            )
        )
        batch.add_column(
            sa.Column("session_epoch", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("last_seen_at", DateTimeUTC(timezone=True), nullable=True))
    _restore_email_index()
    op.create_table(
        "account_tokens",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("kind", _enum("account_token_kind", "invite", "reset"), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("user_id", GUID(length=16), nullable=True),
        sa.Column("created_by", GUID(length=16), nullable=True),
        sa.Column("expires_at", DateTimeUTC(timezone=True), nullable=False),
        sa.Column("used_at", DateTimeUTC(timezone=True), nullable=True),
        sa.Column("created_at", DateTimeUTC(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_account_tokens_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["created_by"],
            ["users.id"],
            name=op.f("fk_account_tokens_created_by_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_account_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_account_tokens_token_hash")),
    )
    op.create_index("ix_account_tokens_user_id", "account_tokens", ["user_id"])
    op.create_table(
        "audit_log",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("actor_id", GUID(length=16), nullable=True),
        sa.Column("actor_email", sa.String(length=320), nullable=False),
        sa.Column("action", sa.String(length=40), nullable=False),
        sa.Column("target_id", GUID(length=16), nullable=True),
        sa.Column("target_email", sa.String(length=320), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("created_at", DateTimeUTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_created_at", "audit_log", ["created_at"])
    op.create_index("ix_audit_log_target_id", "audit_log", ["target_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_target_id", table_name="audit_log")
    op.drop_index("ix_audit_log_created_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_account_tokens_user_id", table_name="account_tokens")
    op.drop_table("account_tokens")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("last_seen_at")
        batch.drop_column("session_epoch")
        batch.drop_constraint(
            op.f("ck_users_user_state"), type_="check"
        )  # or SQLite's copy keeps it
        batch.drop_column("state")
    _restore_email_index()
