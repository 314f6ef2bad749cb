"""The streaming core's one port to persistence: all it saves and loads about replies.

- `save_progress`: the flusher's batch of partial texts (app/streaming/manager.py);
- `save_finals`: a batch of ends, all or none (the saver retries it: app/streaming/saving.py);
- `load`: a reply as stored now, for one that is not live here: finished (replayed from its row)
  or streaming on another replica, its row growing with each flush there (app/streaming/poller.py);
- `publish`: an action for the replica running a reply (the receiving end: app/streaming/relay.py;
  on PostgreSQL, LISTEN/NOTIFY: app/db/cancel_channel.py);
- `close_interrupted`: at startup, what a dead process left `streaming`.

The chat domain implements it once, over its reply rows and that channel
(app/domain/chat/replies/ledger.py); the tests, in memory (tests/streaming/core.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from app.streaming.events import CancelCause
from app.streaming.generation import Outcome

ATTACH: Literal["attach"] = "attach"
"""Not a cancel: a client elsewhere still watches this reply, so its disconnect grace restarts."""

Action = CancelCause | Literal["attach"]
"""What one replica tells the others about a reply: stop it (why), or ATTACH. Sent as its value."""


@dataclass(frozen=True, slots=True)
class Progress:
    """A streaming reply's text so far, as the flusher saves it."""

    message_id: str
    text: str
    completion_tokens: int


class ReplyLedger(Protocol):
    async def save_progress(self, progress: Sequence[Progress]) -> None:
        """Several streaming replies' text so far, in one transaction."""
        ...

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        """Several replies' ends in one transaction: all saved, or none (raises)."""
        ...

    async def load(self, message_id: str) -> Outcome | None:
        """The reply as stored now (status `streaming` while it runs elsewhere, text so far), or
        None once it is deleted."""
        ...

    async def publish(self, message_id: str, action: Action) -> None:
        """Tell the other replicas (the one running the reply acts on it)."""
        ...

    async def close_interrupted(self) -> int:
        """At startup, before serving: mark `interrupted` the replies this process's replica
        left `streaming` when it died; returns how many."""
        ...
