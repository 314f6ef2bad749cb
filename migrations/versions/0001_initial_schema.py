"""Initial schema: users, API keys, conversations and messages.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Enums are VARCHARs with CHECK constraints (not native PostgreSQL enums) so that this file runs
unchanged on SQLite and PostgreSQL; their values are spelled out here rather than imported, so the
migration keeps meaning what it meant when it was written.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def _timestamp(name: str, nullable: bool) -> sa.Column:
    return sa.Column(name, DateTimeUTC(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        _timestamp("created_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
    )
    op.create_index("uq_users_email_lower", "users", [sa.text("lower(email)")], unique=True)

    op.create_table(
        "api_keys",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("user_id", GUID(length=16), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        _timestamp("last_used_at", nullable=True),
        _timestamp("revoked_at", nullable=True),
        _timestamp("created_at", nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_keys_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index("ix_api_keys_user_id", "api_keys", ["user_id"])

    op.create_table(
        "conversations",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("user_id", GUID(length=16), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("source", _enum("conversation_source", "page", "api"), nullable=False),
        _timestamp("created_at", nullable=False),
        _timestamp("updated_at", nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_conversations_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    op.create_index(
        "ix_conversations_user_id_updated_at", "conversations", ["user_id", "updated_at"]
    )

    op.create_table(
        "messages",
        sa.Column("id", GUID(length=16), nullable=False),
        sa.Column("conversation_id", GUID(length=16), nullable=False),
        sa.Column("role", _enum("message_role", "system", "user", "assistant"), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "status",
            _enum(
                "message_status",
                "streaming",
                "completed",
                "length",
                "cancelled",
                "disconnected",
                "failed",
                "interrupted",
            ),
            nullable=False,
        ),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("engine_request_id", sa.String(length=64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        _timestamp("queued_at", nullable=True),
        _timestamp("first_token_at", nullable=True),
        _timestamp("finished_at", nullable=True),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("gap_p50_ms", sa.Double(), nullable=True),
        sa.Column("gap_p99_ms", sa.Double(), nullable=True),
        sa.Column("cancel_token_index", sa.Integer(), nullable=True),
        sa.Column("tokens_after_cancel", sa.Integer(), nullable=True),
        sa.Column("client_ttft_ms", sa.Double(), nullable=True),
        _timestamp("created_at", nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_messages_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
    )
    op.create_index(
        "ix_messages_conversation_id_created_at", "messages", ["conversation_id", "created_at"]
    )
    op.create_index("ix_messages_status", "messages", ["status"])


def downgrade() -> None:
    op.drop_table("messages")
    op.drop_table("conversations")
    op.drop_table("api_keys")
    op.drop_table("users")
