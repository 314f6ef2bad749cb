"""What crosses from the engine process to its web workers (app/engine/process/wire.py) arrives
whole: events with every field, refusals with what the web layer reads from them; and a worker
that stops reading cannot grow the engine process's memory."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path

import pytest

from app.engine.base import (
    EngineStats,
    Finished,
    FinishReason,
    PrefixCacheStats,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.process import wire
from app.engine.process.server import EngineServer
from app.engine.synthetic.engine import SyntheticEngine
from app.engine.trtllm.limits import PromptOverBatchError
from app.settings import EngineSettings


def round_trip(value: object) -> object:
    frame = wire.encode(value)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return pickle.loads(frame[4:])


def test_events_cross_with_every_field() -> None:
    delta = TextDelta("héllo 🌈", (1, 2, 3))
    finished = Finished(
        reason=FinishReason.LENGTH,
        prompt_tokens=11,
        completion_tokens=22,
        queued_at=1.5,
        first_token_at=2.5,
        finished_at=3.5,
        error="why",
        admitted_at=1.75,
    )
    # every field differs from its default, so one the pickling forgot would show
    defaults = {f.name: f.default for f in dataclasses.fields(Finished)}
    assert all(getattr(finished, name) != default for name, default in defaults.items())
    assert round_trip([("r", delta), ("r", finished)]) == [("r", delta), ("r", finished)]


def test_refusals_cross_with_what_the_web_layer_reads() -> None:
    for error in (PromptTooLongError(600, 512), PromptOverBatchError(900, 512)):
        copy = round_trip(error)
        assert type(copy) is type(error)
        assert (copy.prompt_tokens, copy.context_size, str(copy)) == (  # type: ignore[attr-defined]
            error.prompt_tokens,
            error.context_size,
            str(error),
        )


def test_stats_cross_whole() -> None:
    stats = EngineStats(
        running=1,
        waiting=2,
        kv_used=3,
        kv_total=4,
        steps=5,
        tokens_generated=6,
        extra={"last_step_ms": 7.0},
        kv_walked=8,
        prefix_cache=PrefixCacheStats(1, 2, 3, 4, 5),
        unavailable="loading",
    )
    assert round_trip(stats) == stats


async def test_a_worker_that_stops_reading_is_let_go_and_its_requests_aborted(
    tmp_path: Path,
) -> None:
    """The engine process in this test's loop (EngineServer over the synthetic engine) and a
    worker that asks for replies, then never reads its events: once its socket holds more than
    the server lets it leave unread, it is disconnected and its requests end (KV freed)."""
    engine = SyntheticEngine(
        EngineSettings(
            kind="synthetic", synthetic_step_ms=1.0, synthetic_per_seq_ms=0.0, kv_cells=80_000
        )
    )
    await engine.start()
    server = EngineServer(engine, str(tmp_path / "engine.sock"), max_unread_bytes=32 * 1024)
    await server.start()
    try:
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(wire.encode(("events",)))
        _, worker_id, *_ = await wire.read(reader)
        calls_reader, calls = await asyncio.open_unix_connection(server.path)
        calls.write(wire.encode(("calls", worker_id)))
        ask = [{"role": "user", "content": "go on [[synthetic:tokens=3000]]"}]
        for i in range(20):
            calls.write(
                wire.encode(("generate", f"r{i}", ask, SamplingParams(max_tokens=3000), None))
            )
            assert await wire.read(calls_reader) == ("ok", None)
        stats = engine.stats()
        assert stats.running + stats.waiting == 20
        for _ in range(500):  # ~200 KB of the socket's own buffer first, then the limit
            stats = engine.stats()
            if stats.running + stats.waiting == 0:
                break
            await asyncio.sleep(0.02)
        assert (stats.running, stats.waiting) == (0, 0)
        assert stats.tokens_generated < 20 * 3000  # cut short, not run to their ends
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            while True:  # what was buffered, then the end: the server let go
                await wire.read(reader)
        writer.close()
        calls.close()
    finally:
        await server.close()
        await engine.shutdown()
