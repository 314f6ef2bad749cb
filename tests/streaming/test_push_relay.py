"""Users' events across replicas (app/db/broadcast.py under app/domain/chat/push/events.py): two
"replicas" in this process, each with its own hub and its own LISTEN connection to the real
PostgreSQL, hear each other's events once, for the right user only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.db.broadcast import LocalBroadcast, PostgresBroadcast, broadcast_for
from app.domain.chat.push.events import ConversationRenamed, PushEvent, UserPush
from app.streaming.manager import GenerationManager
from app.streaming.push import PushHub
from tests.live_server import TEST_POSTGRES_URL


async def next_event(events: AsyncIterator[PushEvent | str | None]) -> PushEvent | str:
    while True:
        event = await asyncio.wait_for(anext(events), 5)
        if event is not None:
            return event


async def test_events_reach_the_users_pages_on_every_replica_once(
    manager: GenerationManager,
) -> None:
    channel = "streamchat_test_push_relay"
    relays = [PostgresBroadcast(TEST_POSTGRES_URL, channel) for _ in range(2)]
    replicas = [UserPush(PushHub(), manager, relay.publish) for relay in relays]
    for relay, push in zip(relays, replicas, strict=True):
        await relay.start(push.receive)
    try:
        with (
            replicas[0].hub.subscribe("alice") as here,
            replicas[1].hub.subscribe("alice") as there,
            replicas[1].hub.subscribe("bob") as bob,
        ):
            renamed = ConversationRenamed("c1", "Über Drachen \u2014 “quoted”")
            replicas[0].publish("alice", renamed)
            here_events, there_events = here.events(0.05), there.events(0.05)
            assert await next_event(here_events) == renamed  # delivered here at once
            assert await next_event(there_events) == renamed  # and on the other replica
            second = ConversationRenamed("c1", "again")
            replicas[1].publish("alice", second)
            # Each replica delivers each event once: its own NOTIFY, heard back, is skipped.
            assert await next_event(here_events) == second
            assert await next_event(there_events) == second
            await asyncio.sleep(0.3)
            assert len(here) == len(there) == len(bob) == 0
    finally:
        for relay in relays:
            await relay.stop()


def test_sqlite_means_one_process() -> None:
    assert isinstance(broadcast_for("sqlite+aiosqlite:///x.db", "c"), LocalBroadcast)
    assert isinstance(broadcast_for(TEST_POSTGRES_URL, "c"), PostgresBroadcast)


async def test_a_payload_from_an_unknown_version_is_ignored(manager: GenerationManager) -> None:
    push = UserPush(PushHub(), manager)
    with push.hub.subscribe("alice") as channel:
        push.receive("alice", '{"event": "from_the_future"}')
        assert len(channel) == 0
        push.receive("alice", '{"event": "conversation_deleted", "conversation_id": "c9"}')
        assert len(channel) == 1
