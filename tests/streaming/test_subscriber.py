"""The subscriber mailbox: coalescing under a slow reader, cursors and resume offsets.

In process, with the synthetic engine and the in-memory ledger (tests/streaming/core.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

from app.engine.base import EngineEvent, Finished, FinishReason, TextDelta
from app.streaming.events import CancelCause, Delta, Final, Start, Status, StreamEvent
from app.streaming.generation import Generation
from app.streaming.manager import GenerationManager
from app.streaming.subscriber import Subscriber, live_events
from tests.streaming.core import ended, read_all, split, start_reply


async def test_a_slow_subscriber_gets_one_coalesced_delta_and_never_holds_the_engine(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=120)
    fast = Subscriber(generation, transport="sse")
    slow = Subscriber(generation, transport="sse")
    fast_events = asyncio.create_task(read_all(fast))
    # The slow one takes nothing until the reply has ended: the engine did not wait for it.
    outcome = await ended(generation)
    assert outcome.status is Status.COMPLETED
    assert slow.cursor == 0 and slow.sent_events == 0
    slow_events = await read_all(slow)

    _, slow_deltas, slow_final = split(slow_events)
    _, fast_deltas, fast_final = split(await fast_events)
    # The whole text, once, in one event; every engine delta beyond the first counted as merged.
    assert [d.text for d in slow_deltas] == [outcome.text]
    assert slow_deltas[0].id == len(outcome.text)
    assert slow.coalesced == generation.parts_between(0, generation.length) - 1 > 0
    # The fast reader saw many events, and the same text.
    assert len(fast_deltas) > 1
    assert "".join(d.text for d in fast_deltas) == outcome.text
    assert slow_final == fast_final and isinstance(slow_final, Final)


async def test_deltas_carry_their_end_offset_and_a_resume_gets_exactly_the_rest(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=80)
    outcome = await ended(generation)
    text = outcome.text
    for after in (0, 1, len(text) // 3, len(text) - 1, len(text)):
        start, deltas, final = split(
            await read_all(Subscriber(generation, transport="sse", after=after))
        )
        assert start.id == after
        assert "".join(d.text for d in deltas) == text[after:]
        cursor = after
        for delta in deltas:  # each id is where that delta ends: nothing missing, nothing twice
            cursor += len(delta.text)
            assert delta.id == cursor
        assert final is not None and final.id == len(text)


async def test_a_resume_offset_out_of_range_is_clamped(manager: GenerationManager) -> None:
    generation = await start_reply(manager, tokens=20)
    outcome = await ended(generation)
    beyond = Subscriber(generation, transport="sse", after=len(outcome.text) + 50)
    start, deltas, final = split(await read_all(beyond))
    assert start.id == len(outcome.text) and deltas == [] and final is not None
    before = Subscriber(generation, transport="sse", after=-5)
    start, deltas, _ = split(await read_all(before))
    assert start.id == 0 and "".join(d.text for d in deltas) == outcome.text


async def test_a_mid_stream_resume_joins_live_and_ends_with_the_whole_reply(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=400, grace_s=60)  # the client may come back
    first = Subscriber(generation, transport="sse")
    events = first.events(0.01)
    received = ""
    async for event in events:  # read until some text has arrived, then drop the connection
        if isinstance(event, Delta):
            received += event.text
            if event.id > 0:
                break
    await events.aclose()
    first.close()
    offset = len(received)
    assert generation.outcome is None, "the reply must still be running for this test to mean much"
    _, deltas, final = split(await read_all(Subscriber(generation, transport="sse", after=offset)))
    assert received + "".join(d.text for d in deltas) == generation.text()
    assert final is not None and final.status is Status.COMPLETED


async def test_text_since_and_parts_between_agree_with_the_engine_deltas(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=60)
    text = (await ended(generation)).text
    parts = generation.parts_between(0, len(text))
    assert parts >= 2
    for offset in range(len(text) + 1):
        assert generation.text_since(offset) == text[offset:]
    assert generation.parts_between(0, 1) == 1  # inside the first part


async def test_live_events_subscribe_when_first_read_and_lets_go_however_it_ends(
    manager: GenerationManager,
) -> None:
    generation = await start_reply(manager, tokens=2000, grace_s=0.0)
    events = live_events(generation, transport="sse", after=0, keepalive_s=0.01)
    assert generation.subscribers == frozenset(), "a stream never read holds nothing"
    first = await anext(events)
    assert isinstance(first, Start) and first.message_id == generation.message_id
    assert len(generation.subscribers) == 1
    await events.aclose()  # the transport closes it before the Final: the client is gone
    assert generation.subscribers == frozenset()
    outcome = await ended(generation)  # no grace: aborted at once
    assert generation.cancel_cause is CancelCause.DISCONNECT
    assert outcome.status is Status.DISCONNECTED


async def test_a_heartbeat_comes_only_after_keepalive_s_of_silence_and_its_timer_ends_with_it() -> (
    None
):
    """The keepalive is one timer per subscriber, re-armed when it fires (not a timeout armed per
    wait): every heartbeat follows `keepalive_s` of silence (so none comes between tokens 30 ms
    apart), a silence gets one about every `keepalive_s`, and when the stream ends its timer is
    gone from the loop. (A loaded machine only stretches the gaps, which the checks allow.)"""
    keepalive_s = 0.1
    feed: asyncio.Queue[EngineEvent | None] = asyncio.Queue()

    async def engine_events() -> AsyncIterator[EngineEvent]:
        while (event := await feed.get()) is not None:
            yield event

    generation = Generation(
        message_id="m",
        request_id="m",
        conversation_id="c",
        user_id="u",
        user_message_id=None,
        source="page",
        model="test",
        grace_s=0.0,
    )
    pump = asyncio.create_task(generation.pump(engine_events(), abort=lambda: None))
    subscriber = Subscriber(generation, transport="sse")
    received: list[tuple[float, StreamEvent | None]] = []

    async def read() -> None:
        async for event in subscriber.events(keepalive_s):
            received.append((time.monotonic(), event))

    reader = asyncio.create_task(read())
    for _ in range(12):  # tokens every 30 ms for 0.36 s: more than 3 keepalive periods
        feed.put_nowait(TextDelta(text="x", token_ids=(1,)))
        await asyncio.sleep(0.03)
    streaming_ended = time.monotonic()
    await asyncio.sleep(0.45)  # silence
    now = time.time()
    feed.put_nowait(Finished(FinishReason.STOP, 1, 12, now, now, now))
    await pump
    generation.finish()
    await asyncio.wait_for(reader, 5)

    assert "".join(e.text for _, e in received if isinstance(e, Delta)) == "x" * 12
    assert isinstance(received[0][1], Start) and isinstance(received[-1][1], Final)
    silences = [t - t0 for (t0, _), (t, e) in itertools.pairwise(received) if e is None]
    assert silences, "no heartbeat in 0.45 s of silence"
    assert min(silences) >= 0.9 * keepalive_s, f"a heartbeat after {min(silences):.3f} s"
    beats_in_silence = [t for t, e in received if e is None and t >= streaming_ended]
    assert len(beats_in_silence) >= 2, f"{len(beats_in_silence)} heartbeats in 0.45 s"
    timer = subscriber._keepalive
    assert timer is not None and timer.cancelled(), "the keepalive timer outlived its stream"
