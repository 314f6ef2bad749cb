"""One reply, one Generation: the server-side object that outlives any single connection.

A Generation pumps its engine stream into an append-only text (a list of parts), and wakes its
subscribers; it is what Stop cancels, what the recorder saves, what a reconnecting client resumes
from and what the admin's live view lists. The pump is its own task, so a client that disconnects
(and has its request task cancelled by the server) cannot interrupt the final database write.

A reply ends in two steps: `pump` returns its `outcome` (the end is known in memory), then
`finish` (the end is saved: app/streaming/saving.py retries the write until it is). Subscribers
get the `final` event at `finish`, or after `final_wait_s` if the save is slow, then marked
`saved: false`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.engine.base import EngineEvent, Finished, FinishReason, TextDelta
from app.engine.streams import EventStream
from app.streaming import metrics
from app.streaming.events import CancelCause, Final, Start, Status
from app.streaming.reply_text import ReplyText

if TYPE_CHECKING:
    from app.streaming.pacing import DeliveryPacer
    from app.streaming.subscriber import Subscriber

log = logging.getLogger(__name__)

_STATUS_BY_REASON = {
    FinishReason.STOP: Status.COMPLETED,
    FinishReason.LENGTH: Status.LENGTH,
    FinishReason.ERROR: Status.FAILED,
}


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000, 3)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Everything the recorder persists about a finished reply, kept as it is: the reply's one
    record, read back the same from storage. Times are `time.time()` seconds."""

    message_id: str
    status: Status
    finish_reason: str | None
    text: str
    prompt_tokens: int
    completion_tokens: int
    queued_at: float
    first_token_at: float | None
    finished_at: float
    ttft_ms: float | None
    gap_p50_ms: float | None
    gap_p99_ms: float | None
    cancel_token_index: int | None
    tokens_after_cancel: int | None
    error: str | None
    # Who stopped a `cancelled` reply: a CancelCause's value ("user", "admin", "signed_out").
    stopped_by: str | None = None


class Generation:
    """A reply being produced: its text so far, its status, its subscribers."""

    def __init__(
        self,
        *,
        message_id: str,
        request_id: str,
        conversation_id: str,
        user_id: str,
        user_message_id: str | None,
        source: str,
        model: str,
        grace_s: float,
        final_wait_s: float = 5.0,
        pacer: DeliveryPacer | None = None,
    ) -> None:
        self.message_id = message_id
        self.request_id = request_id  # the engine's id for this reply
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.user_message_id = user_message_id
        self.source = source  # "page" or "api": decides the disconnect grace period
        self.model = model
        self.grace_s = grace_s
        self.final_wait_s = final_wait_s  # the longest a `final` waits for the save
        self._pacer = pacer  # new text may wait for its tick; None: subscribers woken at once
        self.context_size: int | None = None  # the engine's, for the final event
        self.created_at = time.time()
        self.status = Status.STREAMING
        self.outcome: Outcome | None = None
        self.tokens = 0  # tokens the engine has sampled so far (seen through TextDelta)
        self.cancel_cause: CancelCause | None = None
        self.cancel_token_index: int | None = None
        self._text = ReplyText()
        self._delta_times = array("d")  # when each engine delta arrived (wall clock)
        self._subscribers: set[Subscriber] = set()
        self._done = asyncio.Event()  # the end state is known AND saved
        self.ended_at: float | None = None  # time.monotonic() when the outcome became known
        self._final_timer: asyncio.TimerHandle | None = None
        self._final_wait_over = False  # the final-wait timer has fired
        self.save_attempts = 0  # the saver's bookkeeping, shown by the admin's live view
        self.save_error: str | None = None
        self._abort: Callable[[], None] = lambda: None
        self._grace_timer: asyncio.TimerHandle | None = None
        self._grace_cause = CancelCause.DISCONNECT
        self.flushed_length = 0  # how much text the recorder has saved

    # -- text ---------------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._text.length

    def text(self) -> str:
        return str(self._text)

    def text_since(self, offset: int) -> str:
        """The reply from character `offset` on (offset clamped to what exists)."""
        return self._text.since(max(0, offset))

    def parts_between(self, start: int, end: int) -> int:
        """How many engine deltas the text between two offsets came in."""
        return self._text.pieces_between(start, end)

    @property
    def done(self) -> bool:
        """The reply has ended and its end state is saved."""
        return self._done.is_set()

    @property
    def saving(self) -> bool:
        """The reply has ended; its end state is not saved yet."""
        return self.outcome is not None and not self._done.is_set()

    async def wait_done(self) -> None:
        """Until the reply has ended and its end state is saved."""
        await self._done.wait()

    def final_due(self) -> bool:
        """May a subscriber send the `final` now: saved, or ended `final_wait_s` ago (its timer
        has fired: not a clock reading, since uvloop's millisecond timers may fire a hair before
        `time.monotonic()` agrees, and a stream told "not yet" then waited for its next keepalive)."""
        return self._done.is_set() or self._final_wait_over

    def start_event(self, offset: int = 0) -> Start:
        return Start(
            id=offset,
            message_id=self.message_id,
            conversation_id=self.conversation_id,
            user_message_id=self.user_message_id,
        )

    def final_event(self) -> Final:
        assert self.outcome is not None
        return final_from_outcome(self.outcome, saved=self.done, context_size=self.context_size)

    # -- subscribers --------------------------------------------------------------------------

    def attach(self, subscriber: Subscriber) -> None:
        self._subscribers.add(subscriber)
        if self._grace_timer is not None:  # somebody came back in time
            self._grace_timer.cancel()
            self._grace_timer = None

    def detach(self, subscriber: Subscriber, *, gone: bool, cause: CancelCause) -> None:
        """A subscriber left. If it left before the end and nobody else is here, start the grace."""
        self._subscribers.discard(subscriber)
        if not gone or self.outcome is not None or self._subscribers:
            return
        if cause is CancelCause.DEADLINE or self.grace_s <= 0:
            self.cancel(cause)
        elif self._grace_timer is None:
            loop = asyncio.get_running_loop()
            self._grace_cause = cause
            self._grace_timer = loop.call_later(self.grace_s, self._grace_expired, cause)

    def attached_elsewhere(self) -> None:
        """A client watches this reply through another replica (ATTACH): restart the grace period."""
        if self._grace_timer is not None:
            cause = self._grace_cause
            self._grace_timer.cancel()
            self._grace_timer = asyncio.get_running_loop().call_later(
                self.grace_s, self._grace_expired, cause
            )

    def _grace_expired(self, cause: CancelCause) -> None:
        self._grace_timer = None
        if not self._subscribers:
            self.cancel(cause)

    @property
    def subscribers(self) -> frozenset[Subscriber]:
        return frozenset(self._subscribers)

    def _wake_subscribers(self) -> None:
        for subscriber in self._subscribers:
            subscriber.wake()

    # -- control ------------------------------------------------------------------------------

    def cancel(self, cause: CancelCause) -> bool:
        """Abort the engine request now. Idempotent; returns whether this call cancelled it."""
        if self.outcome is not None or self.cancel_cause is not None:
            return False
        self.cancel_cause = cause
        self.cancel_token_index = self.tokens
        self._abort()
        metrics.ABORTS.labels(cause.value).inc()
        return True

    # -- the pump -----------------------------------------------------------------------------

    async def pump(
        self,
        events: AsyncIterator[EngineEvent],
        abort: Callable[[], None],
    ) -> Outcome:
        """Consume the engine stream to its end; never raises for engine trouble.

        The caller saves the outcome, then calls `finish()`: subscribers see the Final once the
        database has it, so a client that got the Final and reloads sees the same end; or, if the
        save takes over `final_wait_s`, then, marked `saved: false`.
        """
        self._abort = abort
        if self.cancel_cause is not None:  # cancelled before the pump started
            abort()
        finished: Finished | None = None
        error: str | None = None
        try:
            if isinstance(events, EventStream):  # every engine's: no task wake-up per token
                finished = await events.forward_to(self._take_event)
            else:
                async for event in events:
                    if isinstance(event, Finished):
                        finished = event
                        break
                    self._take_event(event)
        except Exception as exc:  # an engine that breaks its contract: still end in a saved state
            log.exception("engine stream for %s failed", self.message_id)
            error = f"engine failure: {exc}"
            abort()
        self.outcome = self._outcome(finished, error)
        self.status = self.outcome.status
        self.ended_at = time.monotonic()
        # A slow save must not hold the Final forever: wake the subscribers when it is due.
        self._final_timer = asyncio.get_running_loop().call_later(
            self.final_wait_s, self._final_wait_up
        )
        metrics.REPLIES.labels(self.status.value).inc()
        if self.outcome.ttft_ms is not None:
            metrics.ENGINE_TTFT.observe(self.outcome.ttft_ms / 1000)
        if finished is not None and finished.admitted_at is not None:
            metrics.QUEUE_WAIT.observe(finished.admitted_at - finished.queued_at)
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        return self.outcome

    def _take_event(self, event: EngineEvent) -> None:
        """One engine event before the Finished: count its tokens, append its text."""
        if isinstance(event, TextDelta):
            self.tokens += len(event.token_ids)
            if event.text:
                self._append(event.text)

    def _final_wait_up(self) -> None:
        self._final_wait_over = True
        self._wake_subscribers()

    def finish(self) -> None:
        """The end state is saved: release the Final to every subscriber."""
        if self._final_timer is not None:
            self._final_timer.cancel()
            self._final_timer = None
        self._done.set()
        self._wake_subscribers()

    def _append(self, text: str) -> None:
        now = time.time()
        if self._delta_times:
            metrics.ENGINE_GAP.observe(now - self._delta_times[-1])
        self._text.append(text)
        self._delta_times.append(now)
        if self._pacer is None:
            self._wake_subscribers()
        else:
            for subscriber in self._subscribers:
                self._pacer.wake(subscriber)

    def _outcome(self, finished: Finished | None, error: str | None) -> Outcome:
        now = time.time()
        if finished is None:
            finished = Finished(
                reason=FinishReason.ERROR,
                prompt_tokens=0,
                completion_tokens=self.tokens,
                queued_at=self.created_at,
                first_token_at=self._delta_times[0] if self._delta_times else None,
                finished_at=now,
                error=error or "engine stream ended without a finish event",
            )
        if finished.reason is FinishReason.CANCELLED:
            status = (self.cancel_cause or CancelCause.SHUTDOWN).status
        else:
            status = _STATUS_BY_REASON[finished.reason]
        gaps = sorted(b - a for a, b in zip(self._delta_times, self._delta_times[1:], strict=False))
        tokens_after_cancel = None
        if self.cancel_token_index is not None:
            tokens_after_cancel = max(0, finished.completion_tokens - self.cancel_token_index)
        p50, p99 = _percentile(gaps, 0.5), _percentile(gaps, 0.99)
        return Outcome(
            message_id=self.message_id,
            status=status,
            finish_reason=finished.reason.value,
            text=self.text(),
            prompt_tokens=finished.prompt_tokens,
            completion_tokens=finished.completion_tokens,
            queued_at=finished.queued_at,
            first_token_at=finished.first_token_at,
            finished_at=finished.finished_at,
            ttft_ms=_ms(finished.queued_at, finished.first_token_at),
            gap_p50_ms=None if p50 is None else round(p50 * 1000, 3),
            gap_p99_ms=None if p99 is None else round(p99 * 1000, 3),
            cancel_token_index=self.cancel_token_index,
            tokens_after_cancel=tokens_after_cancel,
            error=finished.error,
            stopped_by=(
                self.cancel_cause.value
                if status is Status.CANCELLED and self.cancel_cause is not None
                else None
            ),
        )


def final_from_outcome(
    outcome: Outcome, *, saved: bool = True, context_size: int | None = None
) -> Final:
    """The final event, whether the reply is in memory or only in the database (`context_size`:
    the engine's, when known)."""
    return Final(
        id=len(outcome.text),
        status=outcome.status,
        finish_reason=outcome.finish_reason,
        usage={
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        },
        timings={
            "ttft_ms": outcome.ttft_ms,
            "gap_p50_ms": outcome.gap_p50_ms,
            "gap_p99_ms": outcome.gap_p99_ms,
            "total_ms": _ms(outcome.queued_at, outcome.finished_at),
        },
        error=outcome.error,
        saved=saved,
        context_size=context_size,
        stopped_by=outcome.stopped_by,
    )
