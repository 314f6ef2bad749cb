"""The streaming core's ReplyLedger over the chat rows and the cancel channel
(app/domain/chat/replies/ledger.py), on real SQLite and PostgreSQL: what another replica's writes look
like to a reader here, an action published here reaching another replica's listener, and the
rows a dead replica left streaming closed at startup, its siblings' left alone."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.cancel_channel import PostgresCancelChannel, cancel_channel_for
from app.db.session import transaction
from app.domain.accounts.models import User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.replies import turn_rows
from app.domain.chat.replies.ledger import DatabaseLedger
from app.streaming.events import CancelCause, Status
from app.streaming.ledger import ATTACH, Progress
from tests.db.chat_rows import add_turn

Sessions = async_sessionmaker[AsyncSession]


async def test_load_reads_the_row_as_it_grows_ends_and_goes(
    db_sessions: Sessions,
    migrated_database_url: str,
    make_user: Callable[..., Awaitable[User]],
) -> None:
    owner = await make_user()
    conversation = await conversations.create_conversation(db_sessions, owner.id, "t")
    _, reply = await add_turn(db_sessions, conversation.id, "question", "m")
    message_id = str(reply.id)
    channel = cancel_channel_for(migrated_database_url, db_sessions)
    store = DatabaseLedger(db_sessions, channel)  # here, reading
    recorder = DatabaseLedger(db_sessions, channel)  # the replica running the reply, writing

    fresh = await store.load(message_id)
    assert fresh is not None and (fresh.status, fresh.text) == (Status.STREAMING, "")

    await recorder.save_progress([Progress(message_id, "Once upon", 2)])
    flushed = await store.load(message_id)
    assert flushed is not None and (flushed.status, flushed.text) == (Status.STREAMING, "Once upon")

    end = dataclasses.replace(
        flushed,
        status=Status.CANCELLED,
        finish_reason="cancelled",
        text="Once upon a",
        prompt_tokens=9,
        completion_tokens=3,
        queued_at=1_700_000_000.0,
        first_token_at=1_700_000_000.5,
        finished_at=1_700_000_002.0,
        ttft_ms=500.0,
        cancel_token_index=3,
        tokens_after_cancel=0,
    )
    await recorder.save_finals([end])
    final = await store.load(message_id)
    assert final is not None
    assert (final.status, final.finish_reason, final.text) == (
        Status.CANCELLED,
        "cancelled",
        "Once upon a",
    )
    assert (final.prompt_tokens, final.completion_tokens, final.ttft_ms) == (9, 3, 500.0)
    assert final.finished_at == end.finished_at

    await conversations.delete_conversation(db_sessions, owner.id, conversation.id)
    assert await store.load(message_id) is None


async def test_publish_reaches_the_other_replicas(
    db_sessions: Sessions, migrated_database_url: str, database_backend: str
) -> None:
    channel = cancel_channel_for(migrated_database_url, db_sessions)
    store = DatabaseLedger(db_sessions, channel)
    if database_backend == "sqlite":  # one process: nobody to tell, and nothing fails
        assert not channel.relays
        await store.publish("m-1", CancelCause.USER)
        return
    other = PostgresCancelChannel(migrated_database_url, db_sessions)  # another replica
    received: list[tuple[str, str]] = []
    arrived = asyncio.Event()

    def on_action(message_id: str, action: str) -> None:
        received.append((message_id, action))
        if len(received) == 2:
            arrived.set()

    await other.start(on_action)
    try:
        await store.publish("m-1", ATTACH)
        await store.publish("m-1", CancelCause.ADMIN)
        async with asyncio.timeout(10):
            await arrived.wait()
    finally:
        await other.stop()
    assert received == [("m-1", "attach"), ("m-1", "admin")]


async def test_close_interrupted_closes_this_replicas_rows_only(
    db_sessions: Sessions,
    migrated_database_url: str,
    make_user: Callable[..., Awaitable[User]],
) -> None:
    owner = await make_user()
    conversation = await conversations.create_conversation(db_sessions, owner.id, "t")
    channel = cancel_channel_for(migrated_database_url, db_sessions)
    mine, theirs = (
        DatabaseLedger(db_sessions, channel, "r1"),
        DatabaseLedger(db_sessions, channel, "r2"),
    )
    rows = {}
    for replica in ("r1", "r2"):
        async with transaction(db_sessions) as session:
            _, reply, _ = await turn_rows.write_turn(
                session, conversation.id, "q", "m", parent_id=None, replica_id=replica
            )
        rows[replica] = str(reply.id)

    assert await mine.close_interrupted() == 1
    closed, running = await mine.load(rows["r1"]), await mine.load(rows["r2"])
    assert closed is not None and closed.status is Status.INTERRUPTED
    assert running is not None and running.status is Status.STREAMING
    assert await theirs.close_interrupted() == 1
    assert await mine.close_interrupted() == 0
