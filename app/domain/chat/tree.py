"""A conversation's messages as the tree they form (no database here).

Every message follows its `parent_id` (none for a first question); the messages that share a parent
are siblings, the versions of one turn (an edited question, a regenerated reply), oldest first. What
the chat shows, and what the next prompt is built from, is the path from the root to one leaf: the
conversation's `current_leaf_id`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from uuid import UUID

from app.domain.chat.models import Message


class Tree:
    def __init__(self, rows: Iterable[Message]) -> None:
        """`rows`: every message of one conversation (any order)."""
        self.by_id: dict[UUID, Message] = {}
        self.children: dict[UUID | None, list[Message]] = defaultdict(list)
        for m in sorted(rows, key=lambda m: (m.created_at, str(m.id))):
            self.by_id[m.id] = m
            self.children[m.parent_id].append(m)

    def siblings(self, message: Message) -> list[Message]:
        """The versions of `message`'s turn, itself included, oldest first."""
        return self.children[message.parent_id]

    def latest_leaf(self, under: UUID | None = None) -> UUID | None:
        """The end of the newest branch below `under` (None: the whole conversation): the newest
        version at every turn."""
        node = under
        while self.children[node]:
            node = self.children[node][-1].id
        return node

    def path(self, leaf: UUID | None) -> list[Message]:
        """The messages from the root to `leaf`, oldest first (none for None)."""
        found: list[Message] = []
        while leaf is not None:
            message = self.by_id[leaf]
            found.append(message)
            leaf = message.parent_id
        return found[::-1]

    def shown(self, current_leaf: UUID | None) -> list[Message]:
        """The thread on screen: the path to the conversation's current leaf, or, when it has
        none (or one from elsewhere), to the newest branch's."""
        return self.path(current_leaf if current_leaf in self.by_id else self.latest_leaf())

    def is_leaf(self, message: Message) -> bool:
        return not self.children[message.id]
