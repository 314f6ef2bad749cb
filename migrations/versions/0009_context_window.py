"""Each message keeps its token count, and each reply where the model's window on its history began.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

`token_count`: the tokens the message takes in a prompt, its chat template's framing included,
counted once by the engine that answers (app/domain/chat/prompts/window.py); NULL until counted
(rows from before this revision are counted at their next use and stored then).
`window_start_id`: on a reply, the first history message the model was shown for it (NULL: the
conversation from its start). No foreign key, like `conversations.current_leaf_id`: it names a
message of the same conversation, and messages are only ever deleted with their conversation.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from advanced_alchemy.types import GUID
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("token_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("window_start_id", GUID(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("window_start_id")
        batch.drop_column("token_count")
