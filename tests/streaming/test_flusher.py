"""The flusher: partial text of running replies reaches the ledger in one batch per tick.

In process, with the synthetic engine and the in-memory ledger (tests/streaming/core.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from app.streaming.events import CancelCause
from app.streaming.generation import Generation
from app.streaming.manager import GenerationManager
from tests.streaming.core import MemoryLedger, ended, start_reply

LONG = 100_000


async def _some_text(*generations: Generation) -> None:
    for generation in generations:
        while generation.length == 0:  # noqa: ASYNC110 -- the engine's first step
            await asyncio.sleep(0.001)


async def test_one_flush_saves_every_running_reply_in_one_batch(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    running = [await start_reply(manager, tokens=LONG) for _ in range(3)]
    await _some_text(*running)
    await manager.flush()
    assert len(ledger.progress) == 1
    batch = {p.message_id: p for p in ledger.progress[0]}
    assert set(batch) == {g.message_id for g in running}
    for generation in running:
        saved = batch[generation.message_id]
        # A prefix of the reply (it grows on), remembered as flushed up to there.
        assert generation.text().startswith(saved.text) and saved.text
        assert generation.flushed_length == len(saved.text)
        assert saved.completion_tokens > 0


async def test_a_flush_skips_replies_that_did_not_grow_or_have_ended(
    manager: GenerationManager, ledger: MemoryLedger
) -> None:
    ledger.gate.clear()  # the ended reply stays registered, unsaved, while this runs
    done = await start_reply(manager, tokens=5)
    await ended(done)
    await manager.flush()
    assert ledger.progress == [], "an ended reply's text goes with its final write"
    running = await start_reply(manager, tokens=LONG)
    await _some_text(running)
    await manager.flush()
    assert [p.message_id for p in ledger.progress[-1]] == [running.message_id]
    running.cancel(CancelCause.USER)
    await ended(running)
    await manager.flush()
    assert len(ledger.progress) == 1, "nothing grew, or it ended: no write"


async def test_the_flusher_runs_on_its_own_and_survives_a_failed_batch(
    make_manager: Callable[..., Awaitable[GenerationManager]], ledger: MemoryLedger
) -> None:
    ledger.fail_progress_next = 1
    manager = await make_manager(flush_interval_s=0.01)
    running = await start_reply(manager, tokens=LONG)
    while not ledger.progress:  # noqa: ASYNC110 -- the tick after the failed one saves
        await asyncio.sleep(0.005)
    assert ledger.fail_progress_next == 0, "the first tick failed"
    assert ledger.progress[0][0].message_id == running.message_id
