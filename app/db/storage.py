"""A database that refuses writes for want of storage: told apart from bugs, watched, recovered from.

Three refusals are the server's state, not a bug (so 503s that say so, never a bare 500):

- SQLite's SQLITE_FULL, "database or disk is full" (its volume has no room left), and
  SQLITE_READONLY (the file or its volume became read-only);
- PostgreSQL's `disk_full` (SQLSTATE 53100) and `read_only_sql_transaction` (25006: the server is a
  standby now, or `default_transaction_read_only` was switched on).

`watch_storage` hooks the engine's `handle_error` event, so every statement and commit of the app
is covered, whichever service ran it: the driver's error becomes `StorageRefusedError` (mapped to
a 503 with Retry-After in app/domain/refusals.py) and `StorageHealth` notes the refusal. A
read-only refusal also discards its connection (`is_disconnect`): a session that a read-only
server handed out stays read-only, and the pool must reconnect once the server takes writes again.

`StorageHealth.check()` (from /readyz, and every few seconds) says whether writes can go through
again: on SQLite, whether the database's volume has room; on PostgreSQL, whether a new transaction
is read-write (then the pool is renewed: its sessions may be read-only still). For what cannot be
asked (PostgreSQL's free space short of writing; a read-only SQLite file) writes are let through
again `UNSEEN_RETRY_S` after the last refusal, and the next write tells.
Replies that end meanwhile wait in memory and are saved by the final saver's retries
(app/streaming/saving.py), so nothing needs a restart once storage is back.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

_SQLITE_READONLY, _SQLITE_FULL = 8, 13  # result codes (their low byte): sqlite.org/rescode.html
_POSTGRES_DISK_FULL, _POSTGRES_READ_ONLY = "53100", "25006"

FULL = "full"
READ_ONLY = "read-only"
MIN_FREE_BYTES = 64 * 1024  # a SQLite volume with less than this left is full for our purposes
# A refusal that cannot be asked about (PostgreSQL's full disk, SQLite read-only): writes are let
# through again this long after the last one; the next write says whether it still refuses.
UNSEEN_RETRY_S = 5.0


class StorageRefusedError(Exception):
    """The database refuses writes (no space left, or read-only): nothing new can be saved now."""

    retry_after_s = 10

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        if kind == FULL:
            message = "the server's storage is full: nothing new can be saved until space is freed"
        else:
            message = "the database is read-only at the moment: nothing new can be saved"
        super().__init__(message)


def storage_refusal(original: Any) -> str | None:
    """FULL or READ_ONLY when the driver's error is one of the refusals above, else None.
    sqlite3's errors carry `sqlite_errorcode`; asyncpg's, as SQLAlchemy adapts them, `sqlstate`."""
    code = getattr(original, "sqlite_errorcode", None)
    if code is not None:
        return {_SQLITE_FULL: FULL, _SQLITE_READONLY: READ_ONLY}.get(code & 0xFF)
    sqlstate = getattr(original, "sqlstate", None)
    return {_POSTGRES_DISK_FULL: FULL, _POSTGRES_READ_ONLY: READ_ONLY}.get(sqlstate)


class StorageHealth:
    """Whether the database takes writes now, as its refusals and `check()` tell."""

    def __init__(
        self, database_url: str, on_change: Callable[[str | None], None] | None = None
    ) -> None:
        url = make_url(database_url)
        self.sqlite_dir: Path | None = None
        if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
            self.sqlite_dir = Path(url.database).expanduser().resolve().parent
        self.on_change = on_change
        self.kind: str | None = None  # FULL, READ_ONLY, or None: writes go through
        self.detail = ""
        self.since: float | None = None  # wall-clock time of the first refusal
        self.last_refusal = 0.0  # monotonic
        self.refusals = 0

    @property
    def problem(self) -> str | None:
        """What /readyz and the admin read: None while writes go through."""
        if self.kind is None:
            return None
        return f"{self.kind}: {self.detail}"

    def refused(self, kind: str, detail: str) -> None:
        self.refusals += 1
        self.last_refusal = time.monotonic()
        if self.kind != kind or self.detail != detail:
            if self.kind is None:
                self.since = time.time()
                log.error("the database refuses writes (%s: %s)", kind, detail)
            self.kind, self.detail = kind, detail
            if self.on_change is not None:
                self.on_change(self.kind)

    def cleared(self) -> None:
        if self.kind is not None:
            log.warning(
                "the database takes writes again (it refused %s: %s)", self.kind, self.detail
            )
            self.kind, self.detail, self.since = None, "", None
            if self.on_change is not None:
                self.on_change(None)

    def _sqlite_free_bytes(self) -> int | None:
        if self.sqlite_dir is None:
            return None
        try:
            stat = os.statvfs(self.sqlite_dir)
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize

    async def check(self, engine: AsyncEngine) -> str | None:
        """Look again, cheaply; returns `problem`."""
        free = self._sqlite_free_bytes()
        if free is not None and free < MIN_FREE_BYTES:
            self.refused(FULL, f"{free} bytes free on the database's volume")
        elif free is not None and self.kind == FULL:
            self.cleared()
        elif engine.dialect.name == "postgresql" and self.kind != FULL:
            await self._check_postgres_writable(engine)
        elif self.kind is not None and time.monotonic() - self.last_refusal > UNSEEN_RETRY_S:
            self.cleared()  # nothing to ask: the next write says whether it still refuses
        return self.problem

    async def _check_postgres_writable(self, engine: AsyncEngine) -> None:
        async with engine.connect() as connection:
            read_only = await connection.scalar(text("SHOW transaction_read_only"))
            if read_only == "on":
                await connection.invalidate()  # a session of a read-only server stays read-only
        if read_only == "on":
            self.refused(READ_ONLY, "new transactions are read-only")
        elif self.kind == READ_ONLY:
            self.cleared()
            await engine.dispose()  # every pooled session may be read-only still: new ones


def watch_storage(engine: AsyncEngine, health: StorageHealth) -> None:
    """Turn the engine's storage refusals into `StorageRefusedError`, noted in `health`."""

    def on_error(context: ExceptionContext) -> StorageRefusedError | None:
        kind = storage_refusal(context.original_exception)
        if kind is None:
            return None
        detail = str(context.original_exception).splitlines()[0][:200]
        health.refused(kind, detail)
        if kind == READ_ONLY:
            context.is_disconnect = True  # drop the connection: its session may stay read-only
        return StorageRefusedError(kind, detail)

    event.listen(engine.sync_engine, "handle_error", on_error)
