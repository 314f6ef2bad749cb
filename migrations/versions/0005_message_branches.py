"""Conversations become trees: edit and regenerate add branches instead of replacing rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Each message points at the one it follows (`parent_id`); siblings, which share a parent, are the
versions of one turn (an edited question, a regenerated reply), and `conversations.current_leaf_id`
is the end of the branch shown last. The upgrade derives the tree from the linear order: each kept
message follows the kept message before it, and a replaced reply (`replaced_at` set) answers the
question before it, next to its replacement. The downgrade goes back to one line: whatever is not
on the path to the leaf is marked replaced, at the moment the sibling that took its place was
written, so an upgrade followed by a downgrade gives back the very same rows.

Data moves with plain Core statements on tables spelled out here, not the app's models, so the
migration keeps meaning what it meant when it was written.
"""

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 500  # rows per UPDATE round trip


def _conversations() -> Any:
    return sa.table(
        "conversations", sa.column("id", GUID(length=16)), sa.column("current_leaf_id", GUID(16))
    )


def _messages(extra: str) -> Any:
    """The messages' columns this migration reads, with `extra` (parent_id or replaced_at)."""
    return sa.table(
        "messages",
        sa.column("id", GUID(length=16)),
        sa.column("conversation_id", GUID(length=16)),
        sa.column("role", sa.String(16)),
        sa.column("created_at", DateTimeUTC(timezone=True)),
        sa.column(extra, GUID(length=16) if extra == "parent_id" else DateTimeUTC(timezone=True)),
    )


def _update(table: Any, values: dict[Any, dict[str, Any]]) -> None:
    """Set each row's columns (`values`: id -> {column: value}), in batches of executemany."""
    if not values:
        return
    columns = list(next(iter(values.values())))
    # The parameters need names other than the columns' (SQLAlchemy keeps those for SET).
    statement = (
        sa.update(table)
        .where(table.c.id == sa.bindparam("row_id"))
        .values({name: sa.bindparam(f"new_{name}") for name in columns})
    )
    rows = [
        {"row_id": row_id, **{f"new_{name}": value for name, value in row.items()}}
        for row_id, row in values.items()
    ]
    for start in range(0, len(rows), BATCH):
        op.get_bind().execute(statement, rows[start : start + BATCH])


def _by_conversation(messages: Any, extra: str) -> dict[Any, list[Any]]:
    """Every message (id, role, created_at, extra) per conversation, oldest first."""
    m = messages.c
    rows = op.get_bind().execute(
        sa.select(m.conversation_id, m.id, m.role, m.created_at, m[extra]).order_by(
            m.conversation_id, m.created_at, m.id
        )
    )
    found: dict[Any, list[Any]] = defaultdict(list)
    for row in rows:
        found[row[0]].append(row[1:])
    return found


def upgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("current_leaf_id", GUID(length=16), nullable=True))
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("parent_id", GUID(length=16), nullable=True))
        batch.create_index("ix_messages_parent_id", ["parent_id"])
        batch.create_foreign_key(
            "fk_messages_parent_id_messages", "messages", ["parent_id"], ["id"], ondelete="CASCADE"
        )
    parents: dict[Any, dict[str, Any]] = {}
    leaves: dict[Any, dict[str, Any]] = {}
    for conversation_id, rows in _by_conversation(_messages("replaced_at"), "replaced_at").items():
        kept = None  # the last message still in the chat
        question = None  # the last question: what a replaced reply answered
        for message_id, role, _created_at, replaced_at in rows:
            parent = question if replaced_at is not None else kept
            if parent is not None:
                parents[message_id] = {"parent_id": parent}
            if replaced_at is None:
                kept = message_id
            if role == "user":
                question = message_id
        if kept is not None:
            leaves[conversation_id] = {"current_leaf_id": kept}
    _update(_messages("parent_id"), parents)
    _update(_conversations(), leaves)

    with op.batch_alter_table("messages") as batch:
        batch.drop_column("replaced_at")


def _replaced_at(rows: list[Any], leaf: Any) -> dict[Any, datetime]:
    """When each message off the path to `leaf` was replaced: the creation of the sibling after
    the branch it is on (the branch's own first message, or an ancestor's), or else that of the
    sibling on the path (a branch switched back to an older version)."""
    parent_of = {message_id: parent for message_id, _, _, parent in rows}
    created = {message_id: created_at for message_id, _, created_at, _ in rows}
    children: dict[Any, list[Any]] = defaultdict(list)
    for message_id, _, _, parent in rows:  # oldest first
        children[parent].append(message_id)
    if leaf not in parent_of:  # none recorded: the newest version at every turn
        leaf = None
        while children[leaf]:
            leaf = children[leaf][-1]
    path: set[Any] = set()
    node = leaf
    while node is not None:
        path.add(node)
        node = parent_of[node]

    def fork(message_id: Any) -> Any:
        """The message's ancestor-or-self whose parent is on the path (or that is a root)."""
        while (parent := parent_of[message_id]) is not None and parent not in path:
            message_id = parent
        return message_id

    replaced: dict[Any, datetime] = {}
    for message_id, _, _, _ in rows:
        if message_id in path:
            continue
        branch = fork(message_id)
        siblings = children[parent_of[branch]]
        later = siblings[siblings.index(branch) + 1 :]
        chosen = next((s for s in siblings if s in path), None)
        after = later[0] if later else chosen
        replaced[message_id] = created[after] if after is not None else created[message_id]
    return replaced


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("replaced_at", DateTimeUTC(timezone=True), nullable=True))
    conversations = _conversations()
    leaves = dict(
        op.get_bind().execute(sa.select(conversations.c.id, conversations.c.current_leaf_id)).all()
    )
    replaced: dict[Any, dict[str, Any]] = {}
    for conversation_id, rows in _by_conversation(_messages("parent_id"), "parent_id").items():
        for message_id, moment in _replaced_at(rows, leaves.get(conversation_id)).items():
            replaced[message_id] = {"replaced_at": moment}
    _update(_messages("replaced_at"), replaced)

    with op.batch_alter_table("messages") as batch:
        batch.drop_constraint("fk_messages_parent_id_messages", type_="foreignkey")
        batch.drop_index("ix_messages_parent_id")
        batch.drop_column("parent_id")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("current_leaf_id")
