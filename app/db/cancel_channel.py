"""Cross-replica control of a reply: a message published by one app process reaches the one
running the reply.

On PostgreSQL the replicas already share the database, so its LISTEN/NOTIFY is the channel (no
extra service): each replica LISTENs on one connection, and a message is `message_id action`.
What the actions are, and what a replica does on hearing one, is the streaming core's business
(app/streaming/ledger.py, app/streaming/relay.py): here they are plain strings. SQLite means one
process: nothing to relay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db.engine import normalize_database_url
from app.db.listener import Listener
from app.db.session import Sessions, transaction

log = logging.getLogger(__name__)

CHANNEL = "streamchat_cancel"

OnCancel = Callable[[str, str], None]  # (message_id, action)


class CancelChannel(Protocol):
    relays: bool  # whether anything published here reaches another process

    async def start(self, on_cancel: OnCancel) -> None:
        """Listen: `on_cancel` is called with what the other replicas publish."""
        ...

    async def publish(self, message_id: str, action: str) -> None: ...

    async def stop(self) -> None: ...


class LocalCancelChannel:
    """One process: every reply is local, so there is nobody to tell."""

    relays = False

    async def start(self, on_cancel: OnCancel) -> None:
        return None

    async def publish(self, message_id: str, action: str) -> None:
        return None

    async def stop(self) -> None:
        return None


class PostgresCancelChannel:
    relays = True

    def __init__(self, database_url: str, sessions: Sessions) -> None:
        self._sessions = sessions
        self._on_cancel: OnCancel | None = None
        # LISTENs again after the connection is lost (a PostgreSQL restart): app/db/listener.py
        self.listener = Listener(database_url, CHANNEL, self._received)

    async def start(self, on_cancel: OnCancel) -> None:
        self._on_cancel = on_cancel
        await self.listener.start()

    def _received(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        message_id, _, action = payload.partition(" ")
        if self._on_cancel is not None:
            self._on_cancel(message_id, action or "user")  # a bare id: a user's Stop

    async def publish(self, message_id: str, action: str) -> None:
        async with transaction(self._sessions) as session:
            await session.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": CHANNEL, "payload": f"{message_id} {action}"},
            )

    async def stop(self) -> None:
        await self.listener.stop()


def cancel_channel_for(database_url: str, sessions: Sessions) -> CancelChannel:
    if make_url(normalize_database_url(database_url)).get_backend_name() == "postgresql":
        return PostgresCancelChannel(database_url, sessions)
    return LocalCancelChannel()
