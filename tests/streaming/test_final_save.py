"""Final-after-save: a reply's `final` reaches clients once its end is saved, or late marked unsaved.

In process, with the synthetic engine and the in-memory ledger (tests/streaming/core.py), whose
`save_finals` can stall (`gate`) or fail (`fail_next`, `refuse`) on demand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.engine.base import SamplingParams
from app.engine.synthetic.engine import SyntheticEngine
from app.streaming.events import Final, Status
from app.streaming.generation import Generation
from app.streaming.manager import GenerationManager
from app.streaming.saving import FinalSaver
from app.streaming.subscriber import Subscriber
from tests.streaming.core import MemoryLedger, ended, read_all, split, start_reply


async def test_the_final_goes_out_only_after_the_save(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    ledger.gate.clear()  # the database stalls
    generation = await start_reply(manager, tokens=30, final_wait_s=3600)
    reading = asyncio.create_task(read_all(Subscriber(generation, transport="sse")))
    outcome = await ended(generation)
    while ledger.attempts == 0:  # noqa: ASYNC110 -- the saver has taken it and is blocked
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)  # the reader has had every chance to take a Final
    assert not reading.done(), "the Final must wait for the save"
    assert generation.saving and manager.get(generation.message_id) is generation
    ledger.gate.set()
    _, deltas, final = split(await reading)
    assert generation.message_id in ledger.finals  # saved first ...
    assert final is not None and final.saved is True  # ... then released as saved
    assert "".join(d.text for d in deltas) == outcome.text == ledger.finals[outcome.message_id].text
    await generation.wait_done()
    assert manager.get(generation.message_id) is None, "unregistered once saved"


async def test_a_slow_save_releases_the_final_marked_unsaved_then_resume_says_saved(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    ledger.gate.clear()
    generation = await start_reply(manager, tokens=30, final_wait_s=0.05)
    # No keepalive tick to re-check on: the Generation itself wakes the reader when the wait is up.
    subscriber = Subscriber(generation, transport="sse")
    _, deltas, final = split(await read_all(subscriber, keepalive_s=3600))
    assert final is not None and final.saved is False
    assert "".join(d.text for d in deltas) == generation.text()  # its text is the true one
    assert final.status is Status.COMPLETED and final.id == len(generation.text())
    assert ledger.finals == {}, "released before the save, as the flag says"
    # Still live in memory: a resume answers from it, truthfully unsaved.
    assert manager.get(generation.message_id) is generation and generation.saving
    _, _, again = split(await read_all(Subscriber(generation, transport="sse")))
    assert again is not None and again.saved is False
    ledger.gate.set()
    await generation.wait_done()
    _, _, later = split(await read_all(Subscriber(generation, transport="sse")))
    assert later is not None and later.saved is True
    assert later.status is final.status and later.id == final.id


async def test_the_final_goes_out_when_its_timer_fires_even_a_hair_early(
    manager: GenerationManager, ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop's timers (the server's loop) run on a millisecond clock and may fire up to ~1 ms
    before `time.monotonic()` says their delay is up. The final-wait timer firing is what makes
    the final due: before, an early one found it "not yet", the stream sent a heartbeat, and the
    final waited for the next keepalive (15 s in the live stall tests)."""
    loop = asyncio.get_running_loop()
    call_later = loop.call_later

    def early(delay: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        return call_later(max(0.0, delay - 0.002), *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", early)
    ledger.gate.clear()
    generation = await start_reply(manager, tokens=30, final_wait_s=0.05)
    subscriber = Subscriber(generation, transport="sse")
    events = await asyncio.wait_for(read_all(subscriber, keepalive_s=3600), 10)
    _, _, final = split(events)
    assert final is not None and final.saved is False
    ledger.gate.set()
    await generation.wait_done()


async def test_a_failed_final_write_is_retried_until_saved(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    ledger.fail_next = 2
    generation = await start_reply(manager, tokens=10, final_wait_s=3600)
    _, _, final = split(await read_all(Subscriber(generation, transport="sse")))
    assert final is not None and final.saved is True
    assert generation.save_attempts == 3 and ledger.attempts == 3
    assert generation.save_error is not None and "ConnectionError" in generation.save_error


async def _ended_unsaved(engine: SyntheticEngine, count: int) -> list[Generation]:
    """Replies pumped to their end with no manager: ended in memory, not saved, for a FinalSaver."""
    generations = []
    for n in range(count):
        message_id = f"saver-{id(generations)}-{n}"
        generation = Generation(
            message_id=message_id,
            request_id=message_id,
            conversation_id="conv",
            user_id="user",
            user_message_id=None,
            source="page",
            model=engine.model_name,
            grace_s=0.0,
        )
        stream = engine.generate(
            message_id,
            [{"role": "user", "content": f"{message_id} [[synthetic:tokens=5]]"}],
            SamplingParams(max_tokens=10),
        )
        await generation.pump(stream, lambda m=message_id: engine.abort(m))
        generations.append(generation)
    return generations


def _saver(ledger: MemoryLedger) -> FinalSaver:
    """Retries within milliseconds, no jitter: the order of attempts is what is under test."""
    return FinalSaver(ledger.save_finals, first_retry_s=0.01, max_retry_s=0.02, jitter=lambda: 0)


async def test_replies_ending_together_are_saved_in_one_transaction(
    engine: SyntheticEngine, ledger: MemoryLedger
) -> None:
    generations = await _ended_unsaved(engine, 3)
    saver = _saver(ledger)
    for generation in generations:  # all due before the saver's first round
        saver.submit(generation)
    saver.start()
    try:
        for generation in generations:
            await generation.wait_done()
    finally:
        await saver.stop()
    assert ledger.final_batches == [[g.message_id for g in generations]]
    assert ledger.attempts == 1


async def test_a_refused_row_waits_alone_and_the_others_are_saved(
    engine: SyntheticEngine, ledger: MemoryLedger
) -> None:
    refused, *others = await _ended_unsaved(engine, 3)
    ledger.refuse.add(refused.message_id)
    saver = _saver(ledger)
    for generation in (refused, *others):
        saver.submit(generation)
    saver.start()
    try:
        for generation in others:
            await generation.wait_done()
        assert not refused.done
        attempts = refused.save_attempts
        while refused.save_attempts < attempts + 2:  # noqa: ASYNC110 -- retried, never given up
            await asyncio.sleep(0.005)
        assert refused.save_error is not None and "refused" in refused.save_error
        ledger.refuse.clear()  # the database accepts it now
        await refused.wait_done()
    finally:
        await saver.stop()
    assert ledger.finals[refused.message_id].text == refused.text()
    assert all(ledger.finals[g.message_id].text == g.text() for g in others)


async def test_shutdown_interrupts_live_replies_and_saves_their_ends(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    generations = [await start_reply(manager, tokens=100_000) for _ in range(2)]
    for generation in generations:
        while generation.length == 0:  # noqa: ASYNC110 -- some text first
            await asyncio.sleep(0.001)
    await manager.shutdown(timeout_s=5)
    for generation in generations:
        assert generation.done
        saved = ledger.finals[generation.message_id]
        assert saved.status is Status.INTERRUPTED and saved.text == generation.text() != ""
    assert manager.live() == []


async def test_keepalives_flow_while_the_final_waits_for_the_save(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    ledger.gate.clear()
    generation = await start_reply(manager, tokens=10, final_wait_s=3600)
    subscriber = Subscriber(generation, transport="sse")
    heartbeats_while_saving = 0
    final = None
    async for event in subscriber.events(0.01):
        if event is None and generation.saving:  # a heartbeat (None) while the save is pending
            heartbeats_while_saving += 1
            ledger.gate.set()  # now let the database answer
        if isinstance(event, Final):
            final = event
    subscriber.close()
    assert heartbeats_while_saving >= 1
    assert final is not None and final.saved is True
