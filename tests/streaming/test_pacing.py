"""Delivery pacing (app/streaming/pacing.py): on a nearly saturated event loop a client gets new
text at most once per tick, merged; on a loop with room, every piece at once.

In process, with the synthetic engine and the in-memory ledger (tests/streaming/core.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from app.streaming import metrics
from app.streaming.events import Status
from app.streaming.manager import GenerationManager
from app.streaming.pacing import MIN_TICK_S, DeliveryPacer
from app.streaming.subscriber import Subscriber
from tests.streaming.core import ended, read_all, split, start_reply


def test_the_tick_grows_while_the_loop_is_busy_and_stops_once_it_has_room() -> None:
    pacer = DeliveryPacer(max_tick_s=0.1, busy=0.8)
    for _ in range(3):
        pacer.observe(0.2)
    pacer.observe(1.0)  # one busy probe moves the average, not yet past the threshold
    assert pacer.tick_s == 0.0
    ticks = []
    for _ in range(20):
        pacer.observe(1.0)
        ticks.append(pacer.tick_s)
    assert ticks[0] in (0.0, MIN_TICK_S)  # it starts at the smallest tick
    assert ticks == sorted(ticks) and ticks[-1] == 0.1  # grows, up to the max, never past it
    assert metrics.DELIVERY_TICK._value.get() == 0.1
    for _ in range(20):  # between the thresholds: the tick holds
        pacer.observe(0.7)
    assert pacer.tick_s == 0.1
    shrinking = []
    for _ in range(30):
        pacer.observe(0.1)
        shrinking.append(pacer.tick_s)
    assert shrinking == sorted(shrinking, reverse=True) and shrinking[-1] == 0.0
    assert all(t == 0.0 or t >= MIN_TICK_S for t in shrinking)  # off, never a uselessly short tick
    assert metrics.DELIVERY_TICK._value.get() == 0.0


def test_a_zero_max_never_paces() -> None:
    pacer = DeliveryPacer(max_tick_s=0.0, busy=0.8)
    for _ in range(10):
        pacer.observe(1.0)
    assert pacer.tick_s == 0.0


async def paced_manager(
    make_manager: Callable[..., Awaitable[GenerationManager]], tick_s: float
) -> GenerationManager:
    """A manager whose pacer holds `tick_s`: its probe stopped, the tick driven up by hand."""
    pacer = DeliveryPacer(max_tick_s=tick_s, busy=0.8)
    manager = await make_manager(pacer=pacer)
    pacer.stop()
    while pacer.tick_s < tick_s:
        pacer.observe(1.0)
    return manager


async def test_paced_text_leaves_merged_at_most_once_per_tick(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    tick_s = 0.05
    manager = await paced_manager(make_manager, tick_s)
    generation = await start_reply(manager, tokens=300)  # 1 ms steps: ~0.3 s of text
    subscriber = Subscriber(generation, transport="sse")
    started = time.monotonic()
    events = await read_all(subscriber, keepalive_s=60)
    elapsed = time.monotonic() - started
    outcome = await ended(generation)
    _, deltas, final = split(events)
    assert outcome.status is Status.COMPLETED and final is not None
    assert "".join(d.text for d in deltas) == outcome.text
    parts = generation.parts_between(0, generation.length)
    # One send per tick at most (plus the one the end releases), not one per piece of text.
    assert len(deltas) <= elapsed / tick_s + 2 < parts / 4, (len(deltas), elapsed, parts)
    assert subscriber.coalesced == parts - len(deltas)


async def test_the_end_is_not_paced(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    """With a tick far longer than the reply, the text still waiting and the final leave as soon
    as the reply has ended: only new text waits for a tick."""
    manager = await paced_manager(make_manager, 30.0)
    generation = await start_reply(manager, tokens=50)
    subscriber = Subscriber(generation, transport="sse")
    events = await asyncio.wait_for(read_all(subscriber, keepalive_s=60), timeout=10)
    _, deltas, final = split(events)
    assert final is not None and "".join(d.text for d in deltas) == generation.text()


async def test_without_pacing_every_piece_leaves_at_once(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    """The same reply through a started pacer on a loop that keeps up: never paced."""
    manager = await make_manager(pacer=DeliveryPacer(max_tick_s=0.1, busy=0.8))
    generation = await start_reply(manager, tokens=100)
    subscriber = Subscriber(generation, transport="sse")
    _, deltas, _ = split(await read_all(subscriber, keepalive_s=60))
    assert manager.pacer is not None and manager.pacer.tick_s == 0.0
    assert len(deltas) >= generation.parts_between(0, generation.length) * 0.9


async def test_the_probe_sees_a_busy_loop_and_lets_go_once_it_has_room() -> None:
    """The probe reads the loop thread's CPU time: a loop computing between its turns is busy (a
    loop merely sleeping, or waiting for the GIL, is not). The threshold is lower than the
    server's 0.8: beside another test worker's model threads on two cores, a thread computing
    all the time gets ~0.65-0.8 of the wall clock (0.76 failed a CI run at 0.8)."""
    pacer = DeliveryPacer(max_tick_s=0.1, busy=0.4)
    pacer.start()
    try:
        for _ in range(12):  # 60 ms of work between the loop's turns
            until = time.thread_time() + 0.06
            while time.thread_time() < until:
                pass
            await asyncio.sleep(0)
        assert pacer.tick_s >= MIN_TICK_S, pacer.busy_average
        deadline = time.monotonic() + 5
        while pacer.tick_s:
            assert time.monotonic() < deadline, (pacer.tick_s, pacer.busy_average)
            await asyncio.sleep(0.05)
    finally:
        pacer.stop()


async def test_a_loop_that_blocks_without_computing_is_not_busy() -> None:
    pacer = DeliveryPacer(max_tick_s=0.1, busy=0.4)  # the threshold of the test above
    pacer.start()
    try:
        for _ in range(12):
            time.sleep(0.06)  # noqa: ASYNC251 (the point: blocked, not computing)
            await asyncio.sleep(0)
        assert pacer.tick_s == 0.0, pacer.busy_average
    finally:
        pacer.stop()
