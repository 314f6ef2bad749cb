"""A replica keeps hearing the others after its LISTEN connection dies (app/db/listener.py): the
real PostgreSQL terminates the backend (`pg_terminate_backend`, what a restart or an operator does
to it), and the Stop relay and the page-event broadcast listen, and send, again."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.engine import make_url

from app.db.broadcast import PostgresBroadcast
from app.db.cancel_channel import CHANNEL, PostgresCancelChannel
from app.db.listener import Listener
from tests.live_server import TEST_POSTGRES_URL

DSN = make_url(TEST_POSTGRES_URL).set(drivername="postgresql").render_as_string(False)


async def kill_and_wait_for_return(listener: Listener) -> None:
    """Terminate the listener's backend from another connection; return once it listens again."""
    pid = listener.connection.get_server_pid()
    admin = await asyncpg.connect(DSN)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    async with asyncio.timeout(10):
        while listener.reconnects == 0:  # noqa: ASYNC110  (a counter, polled by the test only)
            await asyncio.sleep(0.02)
    assert listener.connection.get_server_pid() != pid


async def notify(channel: str, payload: str) -> None:
    connection = await asyncpg.connect(DSN)
    try:
        await connection.execute("SELECT pg_notify($1, $2)", channel, payload)
    finally:
        await connection.close()


async def test_the_stop_relay_listens_again_after_its_connection_is_killed() -> None:
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    channel = PostgresCancelChannel(TEST_POSTGRES_URL, sessions=None)  # type: ignore[arg-type]
    await channel.start(lambda message_id, action: heard.put_nowait((message_id, action)))
    try:
        await notify(CHANNEL, "m-1 user")
        assert await asyncio.wait_for(heard.get(), 5) == ("m-1", "user")
        await kill_and_wait_for_return(channel.listener)
        await notify(CHANNEL, "m-2 admin")
        assert await asyncio.wait_for(heard.get(), 5) == ("m-2", "admin")
    finally:
        await channel.stop()
    assert channel.listener.connection is None


async def test_the_broadcast_hears_and_sends_again_after_its_connection_is_killed() -> None:
    name = "streamchat_test_relisten"
    relays = [PostgresBroadcast(TEST_POSTGRES_URL, name) for _ in range(2)]
    heard: list[asyncio.Queue[tuple[str, str]]] = [asyncio.Queue(), asyncio.Queue()]
    for relay, queue in zip(relays, heard, strict=True):
        await relay.start(lambda key, payload, q=queue: q.put_nowait((key, payload)))
    try:
        await kill_and_wait_for_return(relays[0].listener)
        relays[1].publish("alice", "to the replica that came back")
        assert await asyncio.wait_for(heard[0].get(), 5) == (
            "alice",
            "to the replica that came back",
        )
        relays[0].publish("bob", "from it")
        assert await asyncio.wait_for(heard[1].get(), 5) == ("bob", "from it")
    finally:
        for relay in relays:
            await relay.stop()


async def test_while_the_database_stays_away_the_listener_keeps_trying(monkeypatch) -> None:
    """Reconnecting to a database that is still down fails, and is tried again with backoff until
    it answers (here: the first three connection attempts are refused)."""
    monkeypatch.setattr("app.db.listener.FIRST_RETRY_S", 0.05)
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    channel = PostgresCancelChannel(TEST_POSTGRES_URL, sessions=None)  # type: ignore[arg-type]
    await channel.start(lambda message_id, action: heard.put_nowait((message_id, action)))
    admin = await asyncpg.connect(DSN)
    attempts = 0
    real_connect = asyncpg.connect

    async def down_for_three_tries(dsn: str) -> asyncpg.Connection:
        nonlocal attempts
        attempts += 1
        if attempts <= 3:
            raise ConnectionRefusedError("the database is restarting")
        return await real_connect(dsn)

    try:
        monkeypatch.setattr("app.db.listener.asyncpg.connect", down_for_three_tries)
        pid = channel.listener.connection.get_server_pid()
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        async with asyncio.timeout(10):
            while channel.listener.reconnects == 0:  # noqa: ASYNC110  (polled by the test only)
                await asyncio.sleep(0.02)
        monkeypatch.undo()
        assert attempts == 4
        await admin.execute("SELECT pg_notify($1, $2)", CHANNEL, "m-3 user")
        assert await asyncio.wait_for(heard.get(), 5) == ("m-3", "user")
    finally:
        await admin.close()
        await channel.stop()
