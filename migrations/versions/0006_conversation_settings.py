"""Per-conversation settings, and each user's defaults for new conversations.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-01

A system prompt and the sampling settings given (a JSON object: a field left out takes the model's
default), per conversation and per user. Nothing existing changes: a conversation with no row uses
the defaults, as every conversation did before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _settings_table(name: str, key: str, parent: str) -> None:
    op.create_table(
        name,
        sa.Column(key, GUID(length=16), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("sampling", sa.JSON(), nullable=False),
        sa.Column("updated_at", DateTimeUTC(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            [key], [f"{parent}.id"], name=op.f(f"fk_{name}_{key}_{parent}"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(key, name=op.f(f"pk_{name}")),
    )


def upgrade() -> None:
    _settings_table("conversation_settings", "conversation_id", "conversations")
    _settings_table("user_chat_defaults", "user_id", "users")


def downgrade() -> None:
    op.drop_table("user_chat_defaults")
    op.drop_table("conversation_settings")
