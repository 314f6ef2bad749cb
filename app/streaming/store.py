"""What the streaming core needs of the database for a reply that is not live in this process.

Such a reply is either finished (replayed from its row) or streaming on another replica: its row
grows with each flush there, and the replicas tell each other about it through a relay (on
PostgreSQL, LISTEN/NOTIFY: app/db/cancel_channel.py). The chat domain implements this protocol
over its rows and that channel (app/domain/chat/reply_store.py).
"""

from __future__ import annotations

from typing import Literal, Protocol

from app.streaming.events import CancelCause
from app.streaming.generation import Outcome

ATTACH: Literal["attach"] = "attach"
"""Not a cancel: a client elsewhere still follows this reply, so its disconnect grace restarts."""

Action = CancelCause | Literal["attach"]
"""What one replica tells the others about a reply: stop it (why), or ATTACH. Sent as its value."""


class ReplyStore(Protocol):
    async def load(self, message_id: str) -> Outcome | None:
        """The reply as stored now (status `streaming` while it runs elsewhere, text so far), or
        None once it is deleted."""
        ...

    async def publish(self, message_id: str, action: Action) -> None:
        """Tell the other replicas (the one running the reply acts on it: app/streaming/relay.py)."""
        ...
