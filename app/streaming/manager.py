"""The generation manager: every live reply, plus the background duties no connection should own.

- a reply's start (`start_reply`): the engine accepts the prompt, the caller's rows are written,
  and only then is the Generation made and pumped;
- one pump task per reply (engine stream -> Generation -> the final write, then unregistered);
- one saver for all final writes (app/streaming/saving.py): retried with backoff until saved, the
  Generation staying registered (resumable, cancellable, listed) until then;
- one flusher for all replies: partial text reaches the database at least every `flush_interval_s`,
  in one batch, so a crash loses at most about that much. It is one task that awaits each batch,
  so flushes never pile up behind a stalled database, and it skips replies that have ended
  (their text goes with the final write);
- one watchdog for all subscribers: a client that took nothing for `client_deadline_s` while text
  was pending is treated as gone.
Nothing here knows HTTP or SQL: persistence goes through one port, a `ReplyLedger`
(app/streaming/ledger.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from app.engine.base import ChatMessages, Engine, EngineEvent, SamplingParams
from app.streaming import metrics
from app.streaming.events import CancelCause
from app.streaming.generation import Generation
from app.streaming.ledger import Progress, ReplyLedger
from app.streaming.pacing import DeliveryPacer
from app.streaming.saving import FinalSaver

log = logging.getLogger(__name__)

FLUSH_FAILURE_LOG_EVERY = 30  # while flushes keep failing, one line per this many


@dataclass(frozen=True, slots=True)
class ReplyRequest:
    """A reply to start: the engine's prompt and sampling, whose it is, and how long it waits for
    a client that left (`grace_s`)."""

    messages: ChatMessages
    params: SamplingParams
    user_id: str  # also the engine's `owner` (fair admission, cache scope: app/engine/base.py)
    source: str  # "page" or "api"
    grace_s: float


@dataclass(frozen=True, slots=True)
class ReplyRows:
    """Where a reply being started was stored: what the caller's `persist` answers."""

    message_id: str
    conversation_id: str
    user_message_id: str


Persist = Callable[[str], Awaitable[ReplyRows]]
"""Writes a reply's rows, given the engine's request id; commits before it returns."""


class GenerationManager:
    def __init__(
        self,
        engine: Engine,
        ledger: ReplyLedger,
        *,
        flush_interval_s: float = 1.0,
        client_deadline_s: float = 30.0,
        final_wait_s: float = 5.0,
        pacer: DeliveryPacer | None = None,
    ) -> None:
        self.engine = engine
        self.ledger = ledger
        self.flush_interval_s = flush_interval_s
        self.client_deadline_s = client_deadline_s
        self.final_wait_s = final_wait_s  # the longest a client's `final` waits for the save
        self.saver = FinalSaver(ledger.save_finals)
        self.pacer = pacer  # paces new text when the loop falls behind (app/streaming/pacing.py)
        self._live: dict[str, Generation] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._accepting = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        interrupted = await self.ledger.close_interrupted()
        if interrupted:
            log.warning(
                "marked %d replies left streaming by a previous run as interrupted", interrupted
            )
        self._accepting = True
        self.saver.start()
        if self.pacer is not None:
            self.pacer.start()
        self._background = [
            asyncio.create_task(self._flush_loop(), name="generation-flusher"),
            asyncio.create_task(self._watchdog_loop(), name="subscriber-watchdog"),
        ]

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop admitting; end every live reply (status interrupted) and wait for its final write.

        Saves still pending at the deadline are lost with the process: each is logged as an error
        with its size (the next start marks its row `interrupted`, with its last flushed text).
        """
        self._accepting = False
        for generation in list(self._live.values()):
            generation.cancel(CancelCause.SHUTDOWN)
        self.saver.hurry()
        if self._pumps:
            await asyncio.wait(self._pumps, timeout=timeout_s)
        for generation in self._live.values():
            log.error(
                "LOST at shutdown: the end of reply %s (%s, %d characters, %d save attempts, "
                "last error: %s) could not be saved; the next start marks it interrupted",
                generation.message_id,
                generation.status.value,
                generation.length,
                generation.save_attempts,
                generation.save_error,
            )
        await self.saver.stop()
        if self.pacer is not None:
            self.pacer.stop()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def accepting(self) -> bool:
        return self._accepting

    # -- replies ------------------------------------------------------------------------------

    async def start_reply(self, request: ReplyRequest, persist: Persist) -> Generation:
        """Start a reply: the engine accepts the prompt, `persist(request_id)` writes its rows,
        then it goes live here, pumped by its own task.

        In that order, so that nothing is left half-done: the engine raises EngineError on bad
        input before anything is written, and a `persist` that raises aborts the engine request
        (closing its stream does: app/engine/base.py) and raises on."""
        request_id = uuid.uuid4().hex
        stream = self.engine.generate(
            request_id, request.messages, request.params, owner=request.user_id
        )
        try:
            rows = await persist(request_id)
        except BaseException:
            await stream.aclose()  # type: ignore[attr-defined]
            raise
        generation = Generation(
            message_id=rows.message_id,
            request_id=request_id,
            conversation_id=rows.conversation_id,
            user_id=request.user_id,
            user_message_id=rows.user_message_id,
            source=request.source,
            model=self.engine.model_name,
            grace_s=request.grace_s,
            final_wait_s=self.final_wait_s,
            pacer=self.pacer,
        )
        generation.context_size = self.engine.context_size
        self._run(generation, stream)
        return generation

    def _run(self, generation: Generation, stream: AsyncIterator[EngineEvent]) -> None:
        self._live[generation.message_id] = generation
        task = asyncio.create_task(
            self._pump(generation, stream), name=f"pump-{generation.message_id}"
        )
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    async def _pump(self, generation: Generation, stream: AsyncIterator[EngineEvent]) -> None:
        request_id = generation.request_id
        try:
            await generation.pump(stream, lambda: self.engine.abort(request_id))
            self.saver.submit(generation)
            await generation.wait_done()  # registered until saved: resume and cancel find it
        finally:
            self._live.pop(generation.message_id, None)

    def get(self, message_id: str) -> Generation | None:
        return self._live.get(message_id)

    def live(self) -> list[Generation]:
        """Replies generating here, and those that ended but are not saved yet; oldest first."""
        return sorted(self._live.values(), key=lambda g: g.created_at)

    def cancel(self, message_id: str, cause: CancelCause) -> bool:
        """Abort a live reply; False if it is not live here (finished, or on another replica)."""
        generation = self._live.get(message_id)
        return generation.cancel(cause) if generation is not None else False

    # -- background duties --------------------------------------------------------------------

    async def flush(self) -> int:
        """Save the partial text of every reply that grew since its last save, in one batch;
        returns how many replies were saved."""
        dirty = [
            g for g in self._live.values() if g.outcome is None and g.length > g.flushed_length
        ]
        if not dirty:
            return 0
        batch = [Progress(g.message_id, g.text(), g.tokens) for g in dirty]
        await self.ledger.save_progress(batch)
        for generation, progress in zip(dirty, batch, strict=True):
            generation.flushed_length = len(progress.text)
        return len(batch)

    async def _flush_loop(self) -> None:
        failing = 0  # flushes failed in a row: the first gets its traceback, the rest one line
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                saved = await self.flush()
            except Exception as exc:
                metrics.FLUSH_FAILURES.inc()
                failing += 1
                if failing == 1:
                    log.exception("flushing partial replies failed; retrying next tick")
                elif failing % FLUSH_FAILURE_LOG_EVERY == 0:
                    log.warning(
                        "flushing partial replies still fails (%d in a row): %s", failing, exc
                    )
            else:
                if failing and saved:
                    log.warning("flushing partial replies works again after %d failures", failing)
                    failing = 0

    async def _watchdog_loop(self) -> None:
        period = max(0.05, min(1.0, self.client_deadline_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for generation in list(self._live.values()):
                for subscriber in generation.subscribers:
                    if subscriber.stalled(now, self.client_deadline_s):
                        log.info(
                            "subscriber of %s stalled: treating it as gone", generation.message_id
                        )
                        subscriber.kill(CancelCause.DEADLINE)
