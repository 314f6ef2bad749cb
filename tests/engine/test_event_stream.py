"""The engine-to-asyncio hand-off (app/engine/streams.py): iterated, or forwarded event by event."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.base import EngineEvent, Finished, FinishReason, TextDelta
from app.engine.streams import EventStream


def finished(reason: FinishReason = FinishReason.STOP) -> Finished:
    return Finished(
        reason=reason,
        prompt_tokens=1,
        completion_tokens=2,
        queued_at=0.0,
        first_token_at=0.1,
        finished_at=0.2,
    )


def stream() -> tuple[EventStream, list[str]]:
    abandoned: list[str] = []
    return EventStream("r1", abandoned.append), abandoned


async def test_forwarding_hands_over_queued_then_pushed_events_and_resolves_to_the_finished() -> (
    None
):
    events, abandoned = stream()
    events.push(TextDelta("a", (1,)))
    seen: list[EngineEvent] = []
    done = events.forward_to(seen.append)
    assert seen == [TextDelta("a", (1,))]  # what was queued, at once
    events.push(TextDelta("b", (2,)))
    assert seen[-1] == TextDelta("b", (2,))  # synchronously: no task wake-up in between
    end = finished()
    events.push(end)
    events.push(TextDelta("late", (3,)))  # nothing after the Finished
    assert await done is end
    assert [e.text for e in seen] == ["a", "b"]  # type: ignore[union-attr]
    await events.aclose()
    assert abandoned == []  # it had ended: nothing to abort


async def test_a_finished_already_queued_resolves_at_once() -> None:
    events, _ = stream()
    end = finished(FinishReason.LENGTH)
    events.push(TextDelta("x", (1,)))
    events.push(end)
    seen: list[EngineEvent] = []
    assert await events.forward_to(seen.append) is end
    assert len(seen) == 1


async def test_a_consumer_that_raises_hears_of_it_once_and_the_stream_ends() -> None:
    events, _ = stream()
    calls: list[EngineEvent] = []

    def broken(event: EngineEvent) -> None:
        calls.append(event)
        raise ValueError("consumer bug")

    done = events.forward_to(broken)
    events.push(TextDelta("a", (1,)))
    events.push(TextDelta("b", (2,)))
    events.push(finished())
    with pytest.raises(ValueError, match="consumer bug"):
        await done
    assert len(calls) == 1 and events.finished


async def test_forwarding_twice_is_refused() -> None:
    events, _ = stream()
    events.forward_to(lambda event: None)
    with pytest.raises(RuntimeError, match="already forwarded"):
        events.forward_to(lambda event: None)


async def test_abandoning_a_forwarded_stream_before_its_end_aborts_the_request() -> None:
    events, abandoned = stream()
    done = events.forward_to(lambda event: None)
    await events.aclose()
    assert abandoned == ["r1"]
    done.cancel()
    with pytest.raises(asyncio.CancelledError):
        await done
