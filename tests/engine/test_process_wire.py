"""What crosses from the engine process to its web workers (app/engine/process/wire.py) arrives
whole: events with every field, refusals with what the web layer reads from them."""

from __future__ import annotations

import dataclasses
import pickle

from app.engine.base import (
    EngineStats,
    Finished,
    FinishReason,
    PrefixCacheStats,
    PromptTooLongError,
    TextDelta,
)
from app.engine.process import wire
from app.engine.trtllm.limits import PromptOverBatchError


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
