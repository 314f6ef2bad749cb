"""Real database faults for live tests: a write lock held by another connection, and a PostgreSQL
database that refuses and drops connections for a while (what a database restart looks like to
the app, without restarting the PostgreSQL server that other people share).

    with write_lock(backend, database_url):    # SQLite: BEGIN IMMEDIATE; PostgreSQL: LOCK TABLE
        ...                                    # the app's writes wait (and on SQLite time out)
    with database_unavailable(backend, database_url):  # the write lock, or PostgreSQL down
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator

import asyncpg
from sqlalchemy.engine import make_url

from tests.live_server import TEST_POSTGRES_URL


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def sqlite_write_lock(database_url: str) -> Iterator[None]:
    """Hold the SQLite file's write lock from another connection (`BEGIN IMMEDIATE`).

    In WAL mode (the app's, app/db/engine.py) readers carry on; every writer waits for the busy
    timeout, then fails with "database is locked".
    """
    path = make_url(database_url).database
    assert path, database_url
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


class _PostgresTableLock:
    """`LOCK TABLE <table> IN <mode> MODE` inside an open transaction, held by a thread."""

    def __init__(self, database_url: str, table: str, mode: str) -> None:
        self.dsn = _asyncpg_dsn(database_url)
        self.sql = f"LOCK TABLE {table} IN {mode} MODE"
        self.locked = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._hold())
        except BaseException as exc:
            self.error = exc
            self.locked.set()

    async def _hold(self) -> None:
        connection = await asyncpg.connect(self.dsn)
        try:
            transaction = connection.transaction()
            await transaction.start()
            await connection.execute(self.sql)
            self.locked.set()
            await asyncio.to_thread(self.release.wait)
            await transaction.rollback()
        finally:
            await connection.close()


@contextlib.contextmanager
def postgres_table_lock(
    database_url: str, table: str = "messages", mode: str = "EXCLUSIVE"
) -> Iterator[None]:
    """Hold a table lock from another connection. EXCLUSIVE (the default) blocks every write to
    the table and lets plain SELECTs through, like SQLite's write lock; the app's blocked writes
    wait for it (PostgreSQL has no busy timeout), they do not fail."""
    lock = _PostgresTableLock(database_url, table, mode)
    lock.thread.start()
    assert lock.locked.wait(30), "could not take the lock"
    if lock.error is not None:
        raise lock.error
    try:
        yield
    finally:
        lock.release.set()
        lock.thread.join(30)


@contextlib.contextmanager
def write_lock(backend: str, database_url: str) -> Iterator[None]:
    """Another connection holds the write lock on the app's messages (see the two above)."""
    if backend == "sqlite":
        with sqlite_write_lock(database_url):
            yield
    else:
        with postgres_table_lock(database_url):
            yield


async def _outage(name: str, until: threading.Event, began: threading.Event) -> int:
    connection = await asyncpg.connect(_asyncpg_dsn(TEST_POSTGRES_URL))
    terminated = 0
    try:
        await connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        began.set()
        while not until.is_set():
            terminated += await connection.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()) AS t",
                name,
            )
            await asyncio.sleep(0.1)
    finally:
        await connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await connection.close()
    return terminated


def _database_name(database_url: str) -> str:
    name = make_url(database_url).database
    assert name and name.startswith("streamchat_live_"), name  # never someone else's database
    return name


@contextlib.contextmanager
def postgres_unavailable(database_url: str) -> Iterator[None]:
    """Make the app's own database unavailable while the block runs: new connections are refused
    (`ALLOW_CONNECTIONS false`) and open ones are terminated every 0.1 s (from a thread); then
    connections are allowed again. The shared PostgreSQL server itself is never restarted."""
    name, until, began, result = (
        _database_name(database_url),
        threading.Event(),
        threading.Event(),
        [],
    )
    thread = threading.Thread(
        target=lambda: result.append(asyncio.run(_outage(name, until, began))), daemon=True
    )
    thread.start()
    assert began.wait(30), "could not make the database unavailable"
    try:
        yield
    finally:
        until.set()
        thread.join(30)
    assert result and result[0] > 0, "no connection of the app's was terminated"


@contextlib.contextmanager
def database_unavailable(backend: str, database_url: str) -> Iterator[None]:
    """No write gets through while the block runs: SQLite's write lock held by another
    connection (the closest SQLite has to a database that is down), or PostgreSQL refusing and
    dropping the app's connections (what a restart looks like to the app)."""
    if backend == "sqlite":
        with sqlite_write_lock(database_url):
            yield
    else:
        with postgres_unavailable(database_url):
            yield


def _refusal_sql(backend: str, message_id: str) -> tuple[list[str], list[str]]:
    """(create, drop) statements of a trigger that refuses to end one message."""
    name = f"refuse_{uuid.UUID(message_id).hex}"
    if backend == "sqlite":
        create = (
            f"CREATE TRIGGER {name} BEFORE UPDATE ON messages"
            f" WHEN NEW.id = X'{uuid.UUID(message_id).hex}' AND NEW.status != 'streaming'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
        return [create], [f"DROP TRIGGER {name}"]
    return (
        [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
            f"CREATE TRIGGER {name} BEFORE UPDATE ON messages FOR EACH ROW"
            f" WHEN (NEW.id = '{message_id}'::uuid AND NEW.status::text <> 'streaming')"
            f" EXECUTE FUNCTION {name}()",
        ],
        [f"DROP TRIGGER {name} ON messages", f"DROP FUNCTION {name}()"],
    )


def _execute(backend: str, database_url: str, statements: list[str]) -> None:
    if backend == "sqlite":
        connection = sqlite3.connect(make_url(database_url).database or "", timeout=30)
        try:
            for statement in statements:
                connection.execute(statement)
            connection.commit()
        finally:
            connection.close()
        return

    async def run() -> None:
        connection = await asyncpg.connect(_asyncpg_dsn(database_url))
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run())


@contextlib.contextmanager
def refuse_final_save(backend: str, database_url: str, message_id: str) -> Iterator[None]:
    """The database refuses to end this one message (a trigger raises on the UPDATE that sets a
    final status), and only it: a row that cannot be saved, whatever the retries."""
    create, drop = _refusal_sql(backend, message_id)
    _execute(backend, database_url, create)
    try:
        yield
    finally:
        _execute(backend, database_url, drop)
