"""Replies can be rated: thumbs up or down with an optional comment, one per reply and user.

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-01

The enum is a VARCHAR with a CHECK constraint, as in 0001, its values spelled out here. Deleting a
reply (its conversation) or a user deletes their ratings (ON DELETE CASCADE).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reply_ratings",
        sa.Column("message_id", GUID(length=16), nullable=False),
        sa.Column("user_id", GUID(length=16), nullable=False),
        sa.Column(
            "rating",
            sa.Enum(
                "up",
                "down",
                name="reply_rating",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("created_at", DateTimeUTC(timezone=True), nullable=False),
        sa.Column("updated_at", DateTimeUTC(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_reply_ratings_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_reply_ratings_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", "user_id", name=op.f("pk_reply_ratings")),
    )
    op.create_index("ix_reply_ratings_updated_at", "reply_ratings", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_reply_ratings_updated_at", table_name="reply_ratings")
    op.drop_table("reply_ratings")
