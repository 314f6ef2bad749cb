"""A conversation's tree as the admin's page shows it: runs of messages with one version each, and
at every turn with several versions, one sub-branch per version, the branch the user sees marked.

Every message carries its position on its branch (1: the first question), and every reply what its
prompt held of the branch before it (issue 22: `window_start_id`, app/domain/chat/prompts/window.py),
said in those positions: "the whole conversation", "from message 7", "only its question"."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from app.domain.admin.views import message_row
from app.domain.chat.models import Conversation, Message
from app.domain.chat.tree import Tree


def conversation_tree(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    """{"messages": [row, ...], "forks": [{"index", "count", "shown", "branch"}, ...]}: the run of
    messages from the root, then the versions of the first turn that has several, each a branch
    of the same shape. Rows carry `shown` (on the branch the user sees), `position` (on its
    branch, from 1) and, for replies, `window` (what the model saw, in words)."""
    tree = Tree(messages)
    shown = {m.id for m in tree.shown(conversation.current_leaf_id)}
    return _branch(tree, tree.children[None], shown, {})


def window_words(reply: Message, positions: dict[UUID, int]) -> str:
    """What `reply`'s prompt held of the branch before it, by the positions of its messages."""
    start = reply.window_start_id
    if start is None:
        return "saw the whole conversation"
    at = positions.get(start)
    if at is None:
        return "saw from a message no longer in the conversation"
    left_out = "message 1 was" if at == 2 else f"messages 1–{at - 1} were"
    if start == reply.parent_id:
        return f"saw only its question (message {at}): {left_out} outside its window"
    return f"saw from message {at}: {left_out} outside its window"


def _branch(
    tree: Tree, versions: list[Message], shown: set[UUID], positions: dict[UUID, int]
) -> dict[str, Any]:
    """`positions`: the ancestors' (filled in as the walk goes down: a reply's window starts at one
    of them)."""
    run: list[dict[str, Any]] = []
    while len(versions) == 1:  # a chain, not recursion: a long conversation stays flat
        message = versions[0]
        parent = positions.get(message.parent_id, 0) if message.parent_id else 0
        positions[message.id] = parent + 1
        row = {**message_row(message), "shown": message.id in shown, "position": parent + 1}
        if str(message.role) == "assistant":
            row["window"] = window_words(message, positions)
        run.append(row)
        versions = tree.children[message.id]
    forks = [
        {
            "index": i,
            "count": len(versions),
            "shown": version.id in shown,
            "branch": _branch(tree, [version], shown, positions),
        }
        for i, version in enumerate(versions, start=1)
    ]
    return {"messages": run, "forks": forks}
