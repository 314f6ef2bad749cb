"""Disconnect grace period and the subscriber watchdog, in process (tests/streaming/core.py).

Orderings, not durations: each test waits for the event it is about (the reply's end), and the
grace periods and deadlines are either much shorter than the reply or much longer than the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from app.streaming.events import CancelCause, Delta, Final, Start, Status
from app.streaming.manager import GenerationManager
from app.streaming.subscriber import Subscriber
from tests.streaming.core import ended, read_all, split, start_reply

LONG = 100_000  # tokens: a reply that does not end on its own during a test


async def _take_first_delta(subscriber: Subscriber) -> None:
    """Read until the first text, then leave the iterator (the connection stays open)."""
    events = subscriber.events(0.01)
    async for event in events:
        if isinstance(event, Delta):
            break
    await events.aclose()


async def test_a_client_gone_for_longer_than_the_grace_aborts_the_reply(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=LONG, grace_s=0.05)
    subscriber = Subscriber(generation, transport="sse")
    await _take_first_delta(subscriber)
    subscriber.close()  # before the Final: the client went away
    assert generation.cancel_cause is None, "the grace period starts; the reply goes on"
    outcome = await ended(generation)
    assert generation.cancel_cause is CancelCause.DISCONNECT
    assert outcome.status is Status.DISCONNECTED
    assert outcome.cancel_token_index is not None and 0 < outcome.cancel_token_index < LONG
    await generation.wait_done()  # and that end is saved like any other


async def test_a_client_back_within_the_grace_keeps_the_reply_alive(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=300, grace_s=0.2)
    first = Subscriber(generation, transport="sse")
    await _take_first_delta(first)
    first.close()
    back = Subscriber(generation, transport="sse", after=first.cursor)
    await asyncio.sleep(0.3)  # past the grace period that the return cancelled
    _, _, final = split(await read_all(back))
    assert generation.cancel_cause is None
    assert final is not None and final.status is Status.COMPLETED


async def test_without_a_grace_period_a_disconnect_aborts_at_once(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=LONG, grace_s=0.0)
    subscriber = Subscriber(generation, transport="sse")
    await _take_first_delta(subscriber)
    subscriber.close()
    assert generation.cancel_cause is CancelCause.DISCONNECT  # synchronously, no timer
    assert (await ended(generation)).status is Status.DISCONNECTED


async def test_a_disconnect_after_the_final_cancels_nothing(manager: GenerationManager) -> None:
    generation = await start_reply(manager, tokens=20, grace_s=0.0)
    _, _, final = split(await read_all(Subscriber(generation, transport="sse")))
    assert final is not None and final.status is Status.COMPLETED
    assert generation.cancel_cause is None


async def test_one_of_two_followers_leaving_does_not_start_the_grace(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=300, grace_s=0.0)
    stays = Subscriber(generation, transport="sse")
    leaves = Subscriber(generation, transport="ws")
    leaves.close()
    _, _, final = split(await read_all(stays))
    assert final is not None and final.status is Status.COMPLETED


async def test_the_watchdog_drops_a_subscriber_that_takes_nothing_while_text_is_pending(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    manager = await make_manager(client_deadline_s=0.1)
    generation = await start_reply(manager, tokens=LONG, grace_s=60)
    stuck = Subscriber(generation, transport="sse")
    events = stuck.events(0.01)
    assert isinstance(await anext(events), Start)
    # The client now stops reading (stuck in a send, as far as the server knows) ...
    outcome = await ended(generation)
    # ... and is treated as gone for good: no grace, the reply is aborted with `deadline`.
    assert generation.cancel_cause is CancelCause.DEADLINE
    assert outcome.status is Status.DISCONNECTED
    assert stuck not in generation.subscribers
    # When its send returns, its stream ends without a Final (the client sees truncation).
    rest = [e async for e in events]
    assert not any(isinstance(e, Final) for e in rest)


async def test_the_watchdog_spares_a_reader_that_keeps_up_and_one_that_waits_for_text(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    manager = await make_manager(client_deadline_s=0.1)
    reading = await start_reply(manager, tokens=600, grace_s=0.0)
    reader = asyncio.create_task(read_all(Subscriber(reading, transport="sse")))
    stuck_on = await start_reply(manager, tokens=LONG, grace_s=0.0)
    stuck = Subscriber(stuck_on, transport="sse")
    await ended(stuck_on)  # the watchdog has run: it dropped the stuck one ...
    assert stuck_on.cancel_cause is CancelCause.DEADLINE
    _, _, final = split(await reader)  # ... and not the one that reads
    assert final is not None and final.status is Status.COMPLETED
    assert reading.cancel_cause is None
    stuck.close()


async def test_a_stuck_subscriber_does_not_abort_a_reply_someone_else_follows(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    manager = await make_manager(client_deadline_s=0.1)
    generation = await start_reply(manager, tokens=2000, grace_s=0.0)
    stuck = Subscriber(generation, transport="sse")
    reader = Subscriber(generation, transport="sse")
    _, _, final = split(await read_all(reader))
    assert final is not None and final.status is Status.COMPLETED
    assert stuck not in generation.subscribers, "the watchdog dropped the stuck one meanwhile"
    stuck.close()


async def test_a_client_following_through_another_replica_keeps_restarting_the_grace(
    manager: GenerationManager,
) -> None:
    # Lasts several grace periods. The grace is 35x the report interval: a loaded machine (the
    # whole suite on two CPUs) can stall the loop for a quarter second, which is not the point.
    generation = await start_reply(manager, tokens=4000, grace_s=0.7)
    subscriber = Subscriber(generation, transport="sse")
    await _take_first_delta(subscriber)
    subscriber.close()
    while generation.outcome is None:  # another replica reports the client often
        generation.attached_elsewhere()
        await asyncio.sleep(0.02)
    assert generation.cancel_cause is None
    assert generation.outcome.status is Status.COMPLETED
