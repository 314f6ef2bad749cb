"""In-process helpers for the streaming core: the synthetic engine and an in-memory ledger.

Nothing here is a mock of the streaming core: the Generation, Subscriber, GenerationManager and
FinalSaver under test are the real ones, driven by the real synthetic engine (app/engine/synthetic/engine.py,
the engine contract without a model). Only persistence is replaced, by `MemoryLedger`, a faithful
implementation of the `ReplyLedger` port (app/streaming/ledger.py) that can be told to stall or
to refuse a save, so that the final-after-save rules can be pinned down without a database, and
that answers reads as another replica's writes would leave a row, one stored version per read.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engine.base import SamplingParams
from app.settings import EngineSettings
from app.streaming.events import Delta, Final, Start, Status, StreamEvent
from app.streaming.generation import Generation, Outcome
from app.streaming.ledger import Action, Progress
from app.streaming.manager import GenerationManager, ReplyRequest, ReplyRows
from app.streaming.subscriber import Subscriber

_ids = itertools.count()


@dataclass
class MemoryLedger:
    """The ReplyLedger port (app/streaming/ledger.py) in memory: what was saved, in what order,
    with faults on demand; and what another replica's writes would leave, scripted.

    - `gate`: while cleared, `save_finals` waits (a stalled database); set by default.
    - `fail_next`: that many `save_finals` calls raise before anything is saved;
      `fail_progress_next`: the same for `save_progress`.
    - `refuse`: message ids whose final write always raises (a row the database refuses);
      a batch containing one fails as a whole, as a transaction does.
    - `log`: ("progress" | "finals", ids), ("load", id, nth load) and ("publish", id, action,
      loads so far), in call order: a test can say when (in polls) something was published
      without reading a clock.
    - `versions`: each `load` of a reply returns the next of them (the last one again once they
      run out; None = deleted), as successive reads of a row another replica keeps writing would.
    - `interrupted`: what `close_interrupted` reports (rows a dead process left streaming).
    """

    progress: list[list[Progress]] = field(default_factory=list)
    finals: dict[str, Outcome] = field(default_factory=dict)
    final_batches: list[list[str]] = field(default_factory=list)
    attempts: int = 0
    fail_next: int = 0
    fail_progress_next: int = 0
    refuse: set[str] = field(default_factory=set)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    log: list[tuple] = field(default_factory=list)
    versions: dict[str, list[Outcome | None]] = field(default_factory=dict)
    loads: int = 0
    interrupted: int = 0

    def __post_init__(self) -> None:
        self.gate.set()

    async def save_progress(self, progress: Sequence[Progress]) -> None:
        if self.fail_progress_next > 0:
            self.fail_progress_next -= 1
            raise ConnectionError("database unavailable (injected)")
        self.progress.append(list(progress))
        self.log.append(("progress", [p.message_id for p in progress]))

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        self.attempts += 1
        await self.gate.wait()
        ids = [o.message_id for o in outcomes]
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ConnectionError("database unavailable (injected)")
        if self.refuse.intersection(ids):
            raise ValueError(f"row refused (injected): {sorted(self.refuse.intersection(ids))}")
        self.final_batches.append(ids)
        self.finals.update((o.message_id, o) for o in outcomes)
        self.log.append(("finals", ids))

    async def load(self, message_id: str) -> Outcome | None:
        self.loads += 1
        self.log.append(("load", message_id, self.loads))
        versions = self.versions.get(message_id, [None])
        return versions.pop(0) if len(versions) > 1 else versions[0]

    async def publish(self, message_id: str, action: Action) -> None:
        self.log.append(("publish", message_id, str(action), self.loads))

    async def close_interrupted(self) -> int:
        closed, self.interrupted = self.interrupted, 0
        return closed

    def published(self) -> list[tuple[str, int]]:
        """(action, loads before it) of every publish."""
        return [(entry[2], entry[3]) for entry in self.log if entry[0] == "publish"]


def stored(
    text: str, status: Status = Status.STREAMING, *, message_id: str = "elsewhere-1"
) -> Outcome:
    """A reply as a row holds it: text so far and status (a final one with its usage and timings)."""
    final = status is not Status.STREAMING
    return Outcome(
        message_id=message_id,
        status=status,
        finish_reason="stop" if final else None,
        text=text,
        prompt_tokens=7,
        completion_tokens=len(text.split()),
        queued_at=1000.0,
        first_token_at=1000.25 if text else None,
        finished_at=1002.0 if final else 0.0,
        ttft_ms=250.0 if text else None,
        gap_p50_ms=12.5 if final else None,
        gap_p99_ms=40.0 if final else None,
        cancel_token_index=None,
        tokens_after_cancel=None,
        error=None,
    )


def engine_settings(**overrides: float) -> EngineSettings:
    """Short synthetic steps: a reply of a few hundred tokens streams in well under a second."""
    values: dict = dict(
        kind="synthetic",
        context_size=8192,
        max_seqs=16,
        kv_cells=65536,
        threads=1,
        synthetic_step_ms=1.0,
        synthetic_per_seq_ms=0.0,
        synthetic_prefill_ms_per_token=0.0,
    )
    values.update(overrides)
    return EngineSettings(**values)


async def start_reply(
    manager: GenerationManager,
    *,
    tokens: int = 40,
    grace_s: float = 0.0,
    final_wait_s: float | None = None,
    prompt: str = "hello",
) -> Generation:
    """One reply of exactly `tokens` synthetic tokens, started and pumped by the manager."""
    n = next(_ids)

    async def persist(request_id: str) -> ReplyRows:
        return ReplyRows(f"msg-{n}", f"conv-{n}", f"question-{n}")

    request = ReplyRequest(
        messages=[{"role": "user", "content": f"{prompt} {n} [[synthetic:tokens={tokens}]]"}],
        params=SamplingParams(max_tokens=tokens + 10, temperature=0.0),
        user_id="user-1",
        source="page",
        grace_s=grace_s,
    )
    generation = await manager.start_reply(request, persist)
    if final_wait_s is not None:  # before its pump, which has not run yet, reads it
        generation.final_wait_s = final_wait_s
    return generation


async def ended(generation: Generation) -> Outcome:
    """Until the reply's end is known in memory (not necessarily saved).

    The Generation has no event for "outcome known" (only for "saved"), hence the short poll."""
    while generation.outcome is None:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    return generation.outcome


async def read_all(subscriber: Subscriber, keepalive_s: float = 0.01) -> list[StreamEvent]:
    """Every event a connection would send, heartbeats left out; closes like the framing does."""
    events: list[StreamEvent] = []
    try:
        async for event in subscriber.events(keepalive_s):
            if event is not None:
                events.append(event)
    finally:
        subscriber.close()
    return events


def split(events: list[StreamEvent]) -> tuple[Start, list[Delta], Final | None]:
    """(start, deltas, final) of one stream, checking that it has that shape."""
    start, *rest = events
    assert isinstance(start, Start)
    final = rest.pop() if rest and isinstance(rest[-1], Final) else None
    assert all(isinstance(e, Delta) for e in rest), rest
    return start, rest, final  # type: ignore[return-value]
