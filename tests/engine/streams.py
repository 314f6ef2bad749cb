"""Reading an engine stream to its end, as every engine test does (one helper, not one per file)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.engine.base import EngineEvent, Finished, TextDelta


async def collect(stream: AsyncIterator[EngineEvent]) -> tuple[str, list[TextDelta], Finished]:
    """(text, deltas, finished): the whole stream, checking the contract's shape on the way.

    Deltas only, then exactly one `Finished`, then nothing."""
    deltas: list[TextDelta] = []
    finished: list[Finished] = []
    async for event in stream:
        assert not finished, "nothing may follow Finished"
        if isinstance(event, TextDelta):
            deltas.append(event)
        else:
            assert isinstance(event, Finished), event
            finished.append(event)
    assert len(finished) == 1, "a stream ends with exactly one Finished"
    return "".join(d.text for d in deltas), deltas, finished[0]
