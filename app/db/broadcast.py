"""Small messages to every replica: on PostgreSQL, NOTIFY on a channel each replica LISTENs to (the
replicas share the database already: no extra service), and nothing to do with SQLite (one process).

Like the cancel channel (app/db/cancel_channel.py), the messages are plain strings here, `key` and
`payload`; what they mean is for the layers above. Each replica hears its own messages too, so
every message carries its sender's `origin` and a replica skips its own. Messages leave in order
through one sender task, and a backlog (a database that is down) is bounded: past it, messages are
dropped and logged, never allowed to grow memory. PostgreSQL limits a payload to 8000 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.engine import make_url

from app.db.engine import normalize_database_url
from app.db.listener import Listener

log = logging.getLogger(__name__)

OnMessage = Callable[[str, str], None]  # (key, payload), from another replica

BACKLOG = 1000


class Broadcast(Protocol):
    relays: bool  # whether anything published here reaches another process

    async def start(self, on_message: OnMessage) -> None: ...

    def publish(self, key: str, payload: str) -> None:
        """Queue a message for the other replicas (never waits)."""
        ...

    async def stop(self) -> None: ...


class LocalBroadcast:
    """One process: nobody to tell."""

    relays = False

    async def start(self, on_message: OnMessage) -> None:
        return None

    def publish(self, key: str, payload: str) -> None:
        return None

    async def stop(self) -> None:
        return None


class PostgresBroadcast:
    relays = True

    def __init__(self, database_url: str, channel: str) -> None:
        self.channel = channel
        self.origin = uuid.uuid4().hex  # this process, to skip its own messages
        # LISTENs again after the connection is lost (a PostgreSQL restart): app/db/listener.py
        self.listener = Listener(database_url, channel, self._received)
        self._on_message: OnMessage | None = None
        self._outbox: asyncio.Queue[str] = asyncio.Queue(BACKLOG)
        self._sender: asyncio.Task[None] | None = None

    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message
        await self.listener.start()
        self._sender = asyncio.create_task(self._send_loop(), name=f"broadcast-{self.channel}")

    def _received(self, _connection: Any, _pid: int, _channel: str, message: str) -> None:
        origin, _, rest = message.partition(" ")
        key, _, payload = rest.partition(" ")
        if origin != self.origin and self._on_message is not None:
            self._on_message(key, payload)

    def publish(self, key: str, payload: str) -> None:
        try:
            self._outbox.put_nowait(f"{self.origin} {key} {payload}")
        except asyncio.QueueFull:
            log.warning(
                "broadcast %s: backlog full, a message for %s is dropped", self.channel, key
            )

    async def _send_loop(self) -> None:
        while True:
            message = await self._outbox.get()
            try:
                # The listening connection sends too: this one task is its only other user.
                await self.listener.execute("SELECT pg_notify($1, $2)", self.channel, message)
            except Exception:
                log.exception("broadcast %s: a message could not be sent", self.channel)

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        await self.listener.stop()


def broadcast_for(database_url: str, channel: str) -> Broadcast:
    if make_url(normalize_database_url(database_url)).get_backend_name() == "postgresql":
        return PostgresBroadcast(database_url, channel)
    return LocalBroadcast()
