"""A conversation's tree as the admin's page shows it: runs of messages with one version each, and
at every turn with several versions, one sub-branch per version, the branch the user sees marked."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from app.domain.admin.views import message_row
from app.domain.chat.models import Conversation, Message
from app.domain.chat.tree import Tree


def conversation_tree(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    """{"messages": [row, ...], "forks": [{"index", "count", "shown", "branch"}, ...]}: the run of
    messages from the root, then the versions of the first turn that has several, each a branch
    of the same shape. Rows carry `shown`: on the branch the user sees."""
    tree = Tree(messages)
    shown = {m.id for m in tree.shown(conversation.current_leaf_id)}
    return _branch(tree, tree.children[None], shown)


def _branch(tree: Tree, versions: list[Message], shown: set[UUID]) -> dict[str, Any]:
    run: list[dict[str, Any]] = []
    while len(versions) == 1:  # a chain, not recursion: a long conversation stays flat
        message = versions[0]
        run.append({**message_row(message), "shown": message.id in shown})
        versions = tree.children[message.id]
    forks = [
        {
            "index": i,
            "count": len(versions),
            "shown": version.id in shown,
            "branch": _branch(tree, [version], shown),
        }
        for i, version in enumerate(versions, start=1)
    ]
    return {"messages": run, "forks": forks}
