"""One short transaction per service call.

The streaming core writes from many tasks at once (a flush per running reply every second), so no
session is ever held across an `await` on the engine or the network: each service function opens a
session, does its work, commits and lets go. Callers pass an `async_sessionmaker`; the objects that
come back are detached but fully loaded, whatever `expire_on_commit` that sessionmaker was built
with.

A database that stays locked (SQLite's busy timeout run out; PostgreSQL's lock, deadlock or
serialization failures; no pooled connection free in time) is `DatabaseBusyError`, which clients get as a 503 with Retry-After
(app/domain/refusals.py), not a 500; so is a connection that died under a statement
(`DatabaseDisconnectedError`, raised by the engine: app/db/engine.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError  # re-exported: refusals.py
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

Sessions = async_sessionmaker[AsyncSession]
"""What every service function takes first: the app's session factory."""

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6  # result codes (their low byte): sqlite.org/rescode.html
_POSTGRES_BUSY = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout, NOWAIT)
}


BUSY = "the database is busy: try again in a moment"


class DatabaseBusyError(Exception):
    """The database stayed locked by other writers past its wait: try again shortly."""

    retry_after_s = 1


class DatabaseDisconnectedError(DatabaseBusyError):
    """The connection was lost mid-statement (the server restarted, failed over, or ended the
    session): the pool has let it go; the next try gets a fresh one."""

    def __init__(self) -> None:
        super().__init__("the connection to the database was lost: try again in a moment")


def is_busy(error: DBAPIError) -> bool:
    """Whether the driver's error says "locked, try again", rather than a bug or a bad value.
    sqlite3's errors carry `sqlite_errorcode` (Python 3.11+); asyncpg's, as SQLAlchemy adapts them,
    `sqlstate` (sqlalchemy/dialects/postgresql/asyncpg.py, `AsyncAdapt_asyncpg_dbapi.Error`)."""
    original: Any = error.orig
    code = getattr(original, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return getattr(original, "sqlstate", None) in _POSTGRES_BUSY


@asynccontextmanager
async def transaction(sessions: Sessions) -> AsyncIterator[AsyncSession]:
    """A session inside a transaction: committed on success, rolled back on any exception; a
    database that stayed locked raises DatabaseBusyError."""
    try:
        async with sessions(expire_on_commit=False) as session, session.begin():
            yield session
    except DBAPIError as exc:
        if is_busy(exc):
            raise DatabaseBusyError(BUSY) from exc
        raise
    except PoolTimeoutError as exc:  # every pooled connection stayed taken (pool_timeout)
        raise DatabaseBusyError(BUSY) from exc
