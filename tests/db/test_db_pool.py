"""The connection pool without a ping per check-out, and SQLite's writers in line (app/db/engine.py,
app/db/sqlite_gate.py), on real databases: a connection PostgreSQL closed (what a restart or an
operator does) is replaced when taken; one that dies under a statement is a 503, and the next try
works; this process's SQLite writers wait for each other in the event loop, never in SQLite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import engine as db_engine_module
from app.db.engine import create_engine, make_sessionmaker, pool_options
from app.db.session import DatabaseBusyError, DatabaseDisconnectedError, transaction
from app.domain.refusals import refusal_for


async def terminate(database_url: str, pid: int) -> None:
    """End backend `pid` from another connection, as a restart would, and let the client see it
    (asyncpg notices the closed socket on its own, as the event loop reads it)."""
    admin = await asyncpg.connect(
        make_url(database_url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.sleep(0.3)


async def backend_pid(engine: AsyncEngine) -> int:
    async with transaction(make_sessionmaker(engine)) as session:
        return int((await session.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_the_pool_is_sized_by_the_settings_and_never_pings(
    migrated_database_url: str,
) -> None:
    engine = create_engine(migrated_database_url, **pool_options(3, 2, 60.0))
    try:
        pool = engine.pool
        assert (pool.size(), pool._max_overflow, pool._recycle) == (3, 2, 60.0)  # type: ignore[attr-defined]
        assert pool._pre_ping is False
    finally:
        await engine.dispose()


@pytest.mark.parametrize("database_backend", ["postgresql"])
async def test_a_pooled_connection_the_server_closed_is_replaced_when_taken(
    migrated_database_url: str,
) -> None:
    engine = create_engine(migrated_database_url, **pool_options(1, 0, 3600))
    try:
        first = await backend_pid(engine)
        assert await backend_pid(engine) == first  # the pool keeps its one connection
        await terminate(migrated_database_url, first)
        replaced = await backend_pid(engine)  # no error: discarded at check-out, no round trip
        assert replaced != first
    finally:
        await engine.dispose()


@pytest.mark.parametrize("database_backend", ["postgresql"])
async def test_a_connection_that_dies_mid_transaction_is_a_503_and_the_next_try_works(
    migrated_database_url: str,
) -> None:
    engine = create_engine(migrated_database_url, **pool_options(2, 0, 3600))
    sessions = make_sessionmaker(engine)
    try:
        with pytest.raises(DatabaseDisconnectedError) as lost:
            async with sessions() as session:  # a send's own session, outside `transaction`
                pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                admin = asyncpg.connect(
                    make_url(migrated_database_url)
                    .set(drivername="postgresql")
                    .render_as_string(False)
                )
                async with asyncio.timeout(10):
                    connection = await admin
                    await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
                    await connection.close()
                await session.execute(text("SELECT 1"))
        refusal = refusal_for(lost.value)
        assert refusal is not None and refusal.status == 503
        assert refusal.headers == {"Retry-After": "1"}
        assert await backend_pid(engine) != pid
    finally:
        await engine.dispose()


@pytest.mark.parametrize("database_backend", ["postgresql"])
async def test_a_statement_cancelled_mid_way_stays_a_cancellation(
    migrated_database_url: str,
) -> None:
    """SQLAlchemy counts a cancelled statement as a disconnect too: it must not come out as a
    503 that a retrying caller (the final saver) would catch, and outlive its own cancel."""
    engine = create_engine(migrated_database_url, **pool_options(1, 0, 3600))
    try:

        async def sleep_in_the_database() -> None:
            async with transaction(make_sessionmaker(engine)) as session:
                await session.execute(text("SELECT pg_sleep(10)"))

        task = asyncio.create_task(sleep_in_the_database())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await backend_pid(engine) > 0  # and the pool serves on
    finally:
        await engine.dispose()


def sqlite_engine(path: Path) -> AsyncEngine:
    """The app's SQLite engine with SQLite's own busy wait off: any writer that meets another
    one's lock in SQLite fails at once."""
    engine = create_engine(f"sqlite:///{path}", **pool_options(20, 10, 3600))

    @event.listens_for(engine.sync_engine, "connect")
    def no_busy_wait(dbapi_connection: object, _record: object) -> None:
        cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.close()

    return engine


async def test_sqlite_writers_of_one_process_wait_in_line_not_in_sqlite(tmp_path: Path) -> None:
    engine = sqlite_engine(tmp_path / "gate.db")
    sessions = make_sessionmaker(engine)
    try:
        async with transaction(sessions) as session:
            await session.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER)"))
            await session.execute(text("INSERT INTO t (id, n) VALUES (1, 0)"))

        async def write() -> None:
            async with transaction(sessions) as session:
                await session.execute(text("UPDATE t SET n = n + 1 WHERE id = 1"))
                await asyncio.sleep(0.002)  # the write lock held across event-loop turns
                await session.execute(text("INSERT INTO t (n) VALUES (1)"))

        await asyncio.gather(*(write() for _ in range(60)))
        async with transaction(sessions) as session:
            counts = (await session.execute(text("SELECT max(n), count(*) FROM t"))).one()
        assert tuple(counts) == (60, 61)
    finally:
        await engine.dispose()


async def test_a_sqlite_writer_that_waits_past_the_busy_timeout_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_engine_module, "SQLITE_BUSY_TIMEOUT_MS", 100)
    engine = create_engine(f"sqlite:///{tmp_path / 'busy.db'}")
    sessions = make_sessionmaker(engine)
    try:
        async with transaction(sessions) as session:
            await session.execute(text("CREATE TABLE t (n INTEGER)"))
        async with transaction(sessions) as holder:
            await holder.execute(text("INSERT INTO t VALUES (1)"))  # holds the write, uncommitted
            with pytest.raises(DatabaseBusyError) as busy:
                async with sessions() as session:  # a send's own session, outside `transaction`
                    await session.execute(text("INSERT INTO t VALUES (2)"))
        assert not isinstance(busy.value, DatabaseDisconnectedError)
        async with transaction(sessions) as session:  # the holder's end let the gate go
            await session.execute(text("INSERT INTO t VALUES (3)"))
            assert (await session.execute(text("SELECT count(*) FROM t"))).scalar_one() == 2
    finally:
        await engine.dispose()
