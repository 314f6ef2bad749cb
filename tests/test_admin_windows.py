"""The admin's conversation view says what each reply's model saw (issue 22, item 3): every
message numbered on its branch, every reply's window in those numbers, on every version of a
forked turn (app/domain/admin/tree_view.py). Rows built in memory: the tree is pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from app.domain.admin.tree_view import conversation_tree
from app.domain.chat.models import Conversation, Message, MessageRole
from app.streaming.events import Status

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Rows:
    def __init__(self) -> None:
        self.conversation = Conversation(id=uuid4(), user_id=uuid4(), title="t")
        self.rows: list[Message] = []

    def add(self, role: str, parent: Message | None, start: Message | None = None) -> Message:
        m = Message(
            id=uuid4(),
            conversation_id=self.conversation.id,
            role=MessageRole(role),
            content=f"{role} {len(self.rows)}",
            status=Status.COMPLETED,
            parent_id=parent.id if parent else None,
            window_start_id=start.id if start else None,
            prompt_tokens=100 if role == "assistant" else None,
            completion_tokens=20 if role == "assistant" else None,
            token_count=10,
            created_at=T0 + timedelta(seconds=len(self.rows)),
        )
        self.rows.append(m)
        return m

    def tree(self, leaf: Message) -> dict[str, Any]:
        self.conversation.current_leaf_id = leaf.id
        return conversation_tree(self.conversation, self.rows)


def by_id(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {m["id"]: m for m in tree["messages"]}
    for fork in tree["forks"]:
        found |= by_id(fork["branch"])
    return found


def test_each_reply_says_from_which_message_its_model_saw() -> None:
    c = Rows()
    q1 = c.add("user", None)
    r1 = c.add("assistant", q1)  # the whole conversation
    q2 = c.add("user", r1)
    r2 = c.add("assistant", q2, start=q1)  # stored as the first message: never, but still right
    q3 = c.add("user", r2)
    r3 = c.add("assistant", q3, start=q2)
    q4 = c.add("user", r3)
    r4 = c.add("assistant", q4, start=q4)  # only the question fitted
    rows = by_id(c.tree(r4))
    assert [rows[str(m.id)]["position"] for m in c.rows] == list(range(1, 9))
    assert rows[str(r1.id)]["window"] == "saw the whole conversation"
    assert rows[str(r3.id)]["window"] == "saw from message 3: messages 1–2 were outside its window"
    assert rows[str(r4.id)]["window"] == (
        "saw only its question (message 7): messages 1–6 were outside its window"
    )
    assert "window" not in rows[str(q1.id)]


def test_the_versions_of_a_turn_are_numbered_on_their_own_branch() -> None:
    c = Rows()
    q1 = c.add("user", None)
    r1 = c.add("assistant", q1)
    q2 = c.add("user", r1)
    r2 = c.add("assistant", q2, start=q2)
    q2_edited = c.add("user", r1)  # an edit of question 2: a version beside it
    r2_edited = c.add("assistant", q2_edited)
    tree = c.tree(r2_edited)
    assert len(tree["forks"]) == 2
    rows = by_id(tree)
    assert rows[str(q2_edited.id)]["position"] == rows[str(q2.id)]["position"] == 3
    assert rows[str(r2.id)]["window"].startswith("saw only its question (message 3): messages 1–2")
    assert rows[str(r2_edited.id)]["window"] == "saw the whole conversation"


def test_a_window_start_that_is_gone_is_said_plainly() -> None:
    c = Rows()
    q1 = c.add("user", None)
    r1 = c.add("assistant", q1)
    q2 = c.add("user", r1)
    r2 = c.add("assistant", q2, start=r1)  # a window from message 2 (a reply first: imported)
    assert by_id(c.tree(r2))[str(r2.id)]["window"] == (
        "saw from message 2: message 1 was outside its window"
    )
    r1.window_start_id = UUID(int=7)
    assert by_id(c.tree(r2))[str(r1.id)]["window"] == (
        "saw from a message no longer in the conversation"
    )
