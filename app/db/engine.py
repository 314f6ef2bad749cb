"""Engines and sessions for SQLite (the default) and PostgreSQL.

SQLite is a single file and needs a little help to serve a streaming server: WAL lets readers run
while a reply is being flushed, a busy timeout makes a second writer wait instead of failing
(this process's writers wait in line before that: app/db/sqlite_gate.py), and foreign keys are
off unless asked for (we need them for cascading deletes).

The pool (`pool_options`, sized by the settings): a burst of sends waits here for connections, so
a check-out costs no round trip. SQLAlchemy's `pool_pre_ping` cost three on asyncpg (BEGIN, `;`,
ROLLBACK: `AsyncAdapt_asyncpg_connection._async_ping`) on every check-out, more than the send's
own read. Instead a connection is recycled after `pool_recycle` seconds (a server or proxy that
drops old connections), and one PostgreSQL closed meanwhile (a restart, a failover, a terminated
backend) is known without asking: asyncpg sees its socket close (`is_closed()`), so the check-out
discards it and takes another (`_discard_closed`). One that dies while in use fails its statement;
SQLAlchemy then invalidates the pool's older connections, and the request gets a 503 with
Retry-After (`DatabaseDisconnectedError`), never a 500.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.db import sqlite_gate
from app.db.session import BUSY, DatabaseBusyError, DatabaseDisconnectedError, is_busy

SQLITE_BUSY_TIMEOUT_MS = 5000
"""How long a SQLite writer waits for another one before giving up (the flushes are short), by
default (DATABASE_BUSY_TIMEOUT_S)."""

_DRIVERLESS_SCHEMES = {
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}


def normalize_database_url(url: str | URL) -> str:
    """Return `url` with an async driver, accepting the spellings hosting platforms hand out.

    `postgres://` and `postgresql://` become `postgresql+asyncpg://`, `sqlite://` becomes
    `sqlite+aiosqlite://`; an explicit driver is kept. asyncpg knows `ssl`, not libpq's
    `sslmode`, so that query parameter is renamed.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    driver = _DRIVERLESS_SCHEMES.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.drivername == "postgresql+asyncpg" and "sslmode" in parsed.query:
        query = dict(parsed.query)
        query.setdefault("ssl", query.pop("sslmode"))
        parsed = parsed.set(query=query)
    return parsed.render_as_string(hide_password=False)


def _ensure_sqlite_dir(url: URL) -> None:
    """Create the folder of a SQLite file so a fresh checkout starts without a setup step."""
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)


def _set_sqlite_pragmas(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer, nor it them
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; an app crash loses nothing
        cursor.execute("PRAGMA foreign_keys=ON")  # ON DELETE CASCADE needs it
    finally:
        cursor.close()


def pool_options(size: int, max_overflow: int, recycle_s: float) -> dict[str, Any]:
    """`create_engine`'s keyword arguments for a pool of `size` connections kept, `max_overflow`
    more opened while those are taken, each replaced once `recycle_s` old (the settings'
    DATABASE_POOL_SIZE, DATABASE_MAX_OVERFLOW, DATABASE_POOL_RECYCLE_S)."""
    return {"pool_size": size, "max_overflow": max_overflow, "pool_recycle": recycle_s}


def _discard_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled asyncpg connection whose socket the server closed is thrown away at check-out
    (the pool then takes, or opens, another): no round trip, as asyncpg already knows."""
    driver = getattr(dbapi_connection, "_connection", None)  # asyncpg's, under SQLAlchemy's adapter
    if driver is not None and driver.is_closed():
        raise exc.DisconnectionError("the server closed this pooled connection")


def _refusal(context: ExceptionContext) -> Exception | None:
    """The database's state, not a bug, whichever code ran the statement (a send commits in its
    own session, outside `transaction`): a connection that died under it (SQLAlchemy then renews
    the pool, on `is_disconnect`) is DatabaseDisconnectedError, a lock waited for too long is
    DatabaseBusyError; both are 503s, not 500s. The driver's errors only: a task cancelled
    mid-statement also counts as a disconnect to SQLAlchemy, and must stay a cancellation."""
    error = context.sqlalchemy_exception
    if not isinstance(error, exc.DBAPIError):
        return None
    if context.is_disconnect and not context.is_pre_ping:
        return DatabaseDisconnectedError()
    if is_busy(error):
        return DatabaseBusyError(BUSY)
    return None


def create_engine(
    url: str | URL, *, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000, **kwargs: Any
) -> AsyncEngine:
    """Create the async engine for `url` (normalised), with SQLite tuned as described above
    (`busy_timeout_s`: SQLite's busy timeout; PostgreSQL has none); `kwargs` go to SQLAlchemy
    (e.g. `pool_options(...)`, or `poolclass=NullPool`)."""
    normalized = make_url(normalize_database_url(url))
    if normalized.get_backend_name() == "sqlite":
        _ensure_sqlite_dir(normalized)
        engine = create_async_engine(normalized, **kwargs)
        busy_ms = round(busy_timeout_s * 1000)
        event.listen(
            engine.sync_engine,
            "connect",
            lambda dbapi_connection, _record: _set_sqlite_pragmas(dbapi_connection, busy_ms),
        )
        sqlite_gate.install(engine.sync_engine, busy_timeout_s)
    else:
        engine = create_async_engine(normalized, **kwargs)
        event.listen(engine.sync_engine, "checkout", _discard_closed)
    event.listen(engine.sync_engine, "handle_error", _refusal)
    return engine


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit: services return them to callers."""
    return async_sessionmaker(engine, expire_on_commit=False)
