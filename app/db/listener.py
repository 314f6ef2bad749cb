"""One PostgreSQL LISTEN connection that comes back after it is lost.

A replica hears the others (Stop relayed to the replica running a reply: app/db/cancel_channel.py;
users' page events: app/db/broadcast.py) on one dedicated asyncpg connection. That connection dies
when PostgreSQL restarts, fails over, or an operator terminates the backend, and nothing would
open it again: the replica would go deaf until it restarted. asyncpg calls a connection's
termination listeners when it is closed for whatever reason (asyncpg/connection.py,
`add_termination_listener`, run from `_cleanup` once the protocol sees the socket go), so the
listener reconnects from there, with backoff, and LISTENs again. What was notified while it was
away is lost (NOTIFY is not queued for absent listeners); the callers' own fallbacks cover that
(a reply's end is in the database; a page reloads its list on reconnecting).

Why not Litestar's `channels` plugin (2.25) with its PostgreSQL backends: neither comes back. The
asyncpg backend (litestar/channels/backends/asyncpg.py) opens its listening connection once in
`on_startup` and never again, so a restart leaves it deaf; the psycopg one (psycopg.py, `_listen`)
hands the connection's error to `stream_events`, which raises it and ends the plugin's delivery.
Both also open a new connection for every `publish`, where ours send on the listening one. The
reconnect-after-restart tests (tests/db/test_listener.py, tests/ops/test_replicas.py) are what
this module must keep passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from app.db.engine import normalize_database_url

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0

OnNotify = Callable[[Any, int, str, str], None]  # asyncpg's (connection, pid, channel, payload)


class Listener:
    def __init__(self, database_url: str, channel: str, on_notify: OnNotify) -> None:
        url = make_url(normalize_database_url(database_url)).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)  # asyncpg's own form
        self.channel = channel
        self._on_notify = on_notify
        self.connection: Any = None  # None while reconnecting
        self.reconnects = 0
        self._stopping = False
        self._reconnecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and LISTEN; a database that is down at start fails the start, as before."""
        self._stopping = False
        await self._connect()

    async def _connect(self) -> None:
        connection = await asyncpg.connect(self._dsn)
        try:
            await connection.add_listener(self.channel, self._on_notify)
        except BaseException:
            await connection.close()
            raise
        connection.add_termination_listener(self._lost)
        self.connection = connection

    def _lost(self, connection: Any) -> None:
        if self._stopping or connection is not self.connection:
            return
        self.connection = None
        log.warning("LISTEN %s: connection lost; reconnecting", self.channel)
        self._reconnecting = asyncio.get_running_loop().create_task(
            self._reconnect(), name=f"relisten-{self.channel}"
        )

    async def _reconnect(self) -> None:
        delay = FIRST_RETRY_S
        while not self._stopping:
            try:
                await self._connect()
            except Exception as exc:
                log.warning(
                    "LISTEN %s: reconnect failed (%s); next try in %.1f s", self.channel, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_S)
                continue
            self.reconnects += 1
            log.info("LISTEN %s: listening again", self.channel)
            return

    async def execute(self, query: str, *args: Any) -> None:
        """Run a statement on the listening connection (the broadcast's NOTIFYs)."""
        connection = self.connection
        if connection is None:
            raise ConnectionError(f"LISTEN {self.channel}: reconnecting")
        await connection.execute(query, *args)

    async def stop(self) -> None:
        self._stopping = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5)
