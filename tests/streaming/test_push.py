"""The per-user push hub (app/streaming/push.py): events reach only their user's channels, a slow
channel's queue stays bounded (one OVERFLOW instead of a backlog), and a closed page is dropped.
In process; the live tests over both transports are tests/serving/test_live_push.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.domain.chat.push_events import ReplyEnded, ReplyStarted, UserPush
from app.streaming.events import CancelCause
from app.streaming.manager import GenerationManager
from app.streaming.push import EVICTED, OVERFLOW, PushChannel, PushHub
from tests.streaming.core import start_reply


async def take(events: AsyncIterator[object], n: int) -> list[object]:
    return [await asyncio.wait_for(anext(events), 1) for _ in range(n)]


async def test_events_reach_every_channel_of_their_user_and_no_other() -> None:
    hub: PushHub[str] = PushHub()
    with (
        hub.subscribe("alice") as tab1,
        hub.subscribe("alice") as tab2,
        hub.subscribe("bob") as bob,
    ):
        assert hub.publish("alice", "renamed") == 2
        assert hub.publish("bob", "created") == 1
        assert hub.publish("carol", "nobody listens") == 0
        assert await take(tab1.events(5), 1) == ["renamed"]
        assert await take(tab2.events(5), 1) == ["renamed"]
        assert await take(bob.events(5), 1) == ["created"]
        assert len(tab1) == len(tab2) == len(bob) == 0  # nothing else was queued for anyone


async def test_events_keep_their_order_and_silence_yields_a_heartbeat() -> None:
    hub: PushHub[int] = PushHub()
    with hub.subscribe("alice") as channel:
        events = channel.events(keepalive_s=0.05)
        for i in range(3):
            hub.publish("alice", i)
        assert await take(events, 4) == [0, 1, 2, None]  # None: idle, send a keepalive
        hub.publish("alice", 3)
        assert await take(events, 1) == [3]


async def test_a_slow_channel_is_bounded_and_told_to_refetch() -> None:
    hub: PushHub[int] = PushHub(capacity=4)
    with hub.subscribe("alice") as slow, hub.subscribe("alice") as fast:
        fast_events = fast.events(keepalive_s=5)
        for i in range(10):
            hub.publish("alice", i)
            assert await take(fast_events, 1) == [i]  # a page that keeps up loses nothing
            assert len(slow) <= 4
        # The slow page's backlog went at the overflow: one OVERFLOW (refetch), then live again.
        events = slow.events(keepalive_s=0.05)
        assert await take(events, 2) == [OVERFLOW, None]
        hub.publish("alice", 10)
        assert await take(events, 1) == [10]


async def test_a_channel_is_unsubscribed_when_its_page_goes() -> None:
    hub: PushHub[str] = PushHub()
    with hub.subscribe("alice") as channel:
        assert hub.channel_count("alice") == 1
        reader = asyncio.create_task(anext(channel.events(keepalive_s=5)))
        await asyncio.sleep(0)
    assert hub.channel_count() == 0 and hub.publish("alice", "late") == 0
    assert channel.closed and len(channel) == 0
    reader.cancel()


async def test_unsubscribing_on_error_too() -> None:
    hub: PushHub[str] = PushHub()
    try:
        with hub.subscribe("alice"):
            raise ConnectionError("the page went away")
    except ConnectionError:
        pass
    assert hub.channel_count() == 0


def test_offer_never_grows_past_capacity() -> None:
    channel: PushChannel[int] = PushChannel(capacity=3)
    for i in range(1000):
        channel.offer(i)
        assert len(channel) <= 3


async def test_a_page_that_connects_hears_the_replies_live_now_then_their_end(
    manager: GenerationManager,
) -> None:
    """The domain's side (app/domain/chat/push_events.py) over this hub and a real manager: the
    user's live page replies first (a page that just opened missed their start), then each end."""
    push = UserPush(PushHub(), manager)
    generation = await start_reply(manager, tokens=200)  # user-1's
    push.reply_started(generation)  # before anyone listens: heard by nobody
    events = push.page_events("user-1", keepalive_s=5)
    started = ReplyStarted(generation.conversation_id, generation.message_id)
    assert await take(events, 2) == [None, started]  # None: subscribed (a first heartbeat)
    others = push.page_events("user-2", keepalive_s=0.05)
    assert await take(others, 2) == [None, None]  # user-2 has nothing live and hears nothing
    generation.cancel(CancelCause.USER)
    ended = ReplyEnded(generation.conversation_id, generation.message_id, "cancelled")
    assert await take(events, 1) == [ended]
    assert await take(others, 1) == [None]
    await events.aclose()
    await others.aclose()
    assert push.hub.channel_count() == 0


async def test_past_the_cap_a_new_channel_ends_the_users_oldest() -> None:
    hub: PushHub[str] = PushHub(max_per_user=2)
    with hub.subscribe("alice") as oldest, hub.subscribe("bob") as bobs:
        oldest_events = oldest.events(keepalive_s=5)
        with hub.subscribe("alice") as second:
            hub.publish("alice", "queued")  # dropped with the oldest channel: it is told to resync
            with hub.subscribe("alice") as newest:  # the third of alice's: the oldest goes
                assert await take(oldest_events, 1) == [EVICTED]
                with pytest.raises(StopAsyncIteration):
                    await anext(oldest_events)
                assert hub.channel_count("alice") == 2 and hub.evicted == 1
                assert hub.publish("alice", "next") == 2
                assert await take(newest.events(5), 1) == ["next"]
                assert await take(second.events(5), 2) == ["queued", "next"]
                assert hub.channel_count("bob") == 1 and len(bobs) == 0  # another user's stay
    assert hub.channel_count() == 0


async def test_ending_a_users_channels_gives_each_a_last_event() -> None:
    hub: PushHub[str] = PushHub()
    with hub.subscribe("alice") as tab1, hub.subscribe("alice") as tab2, hub.subscribe("bob"):
        hub.publish("alice", "stale")
        assert hub.end_user("alice", "signed out") == 2
        for channel in (tab1, tab2):
            assert [e async for e in channel.events(keepalive_s=5)] == ["signed out"]
        assert hub.channel_count("alice") == 0 and hub.channel_count("bob") == 1
        assert hub.publish("alice", "late") == 0
