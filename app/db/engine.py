"""Engines and sessions for SQLite (the default) and PostgreSQL.

SQLite is a single file and needs a little help to serve a streaming server: WAL lets readers run
while a reply is being flushed, a busy timeout makes a second writer wait instead of failing, and
foreign keys are off unless asked for (we need them for cascading deletes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

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


def create_engine(
    url: str | URL, *, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000, **kwargs: Any
) -> AsyncEngine:
    """Create the async engine for `url` (normalised), with SQLite tuned as described above
    (`busy_timeout_s`: SQLite's busy timeout; PostgreSQL has none)."""
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
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(normalized, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit: services return them to callers."""
    return async_sessionmaker(engine, expire_on_commit=False)
