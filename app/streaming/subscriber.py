"""A subscriber is one connection's view of a Generation: a mailbox, not a queue of tokens.

It holds only a cursor (a character offset) into the Generation's text. Whatever arrived since the
connection last took an event leaves as ONE delta, so a slow socket gets fewer, larger events and
the memory a client costs does not grow with how far behind it is. The engine never waits for it.

A connection reads it through `live_events` (below): Start, Delta..., Final, and None when idle
(the transport sends a heartbeat). A stream closed before its Final means the client is gone: the
reply waits its grace period for the client to come back, then is aborted.

A watchdog (the manager's) calls `stalled(now, deadline_s)`: a subscriber that has taken nothing for
the deadline while text is pending is treated as gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from app.streaming import metrics
from app.streaming.events import CancelCause, Delta, StreamEvent

if TYPE_CHECKING:
    from app.streaming.generation import Generation


class Subscriber:
    def __init__(self, generation: Generation, *, transport: str, after: int = 0) -> None:
        self.generation = generation
        self.transport = transport  # "sse", "ws" or "openai": for metrics and the admin view
        self.cursor = max(0, min(after, generation.length))
        self._from_start = self.cursor == 0 and generation.length == 0
        self.sent_events = 0
        self.coalesced = 0  # deltas that left merged with others because the client was busy
        self._waiter: asyncio.Future[None] | None = None  # set while `events()` waits
        self._last_take = time.monotonic()
        self._keepalive_s = 0.0
        self._keepalive: asyncio.TimerHandle | None = None
        self._paced: asyncio.TimerHandle | None = None  # a paced wake-up, due (wake_after)
        self._idle = False  # `keepalive_s` passed with nothing taken: a heartbeat is due
        self._taking = False  # the consumer is waiting in `events()` (not stuck in a send)
        self._final_sent = False
        self._killed: CancelCause | None = None
        self._closed = False
        self._last_delta_at: float | None = None  # wall clock, for the delivered-latency metrics
        # Labelled metrics resolved once, not per event.
        self._coalesced_metric = metrics.COALESCED.labels(transport)
        self._ttft_metric = metrics.DELIVERED_TTFT.labels(transport)
        self._gap_metric = metrics.DELIVERED_GAP.labels(transport)
        self._open_metric = metrics.OPEN_STREAMS.labels(transport)
        generation.attach(self)
        self._open_metric.inc()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake_after(self, interval_s: float) -> None:
        """New text, paced (app/streaming/pacing.py): wake no sooner than `interval_s` after the
        last take; text arriving meanwhile leaves with that one, merged."""
        if self._paced is not None:
            return  # already due
        wait_s = self._last_take + interval_s - time.monotonic()
        if wait_s <= 0:
            self.wake()
        else:
            self._paced = asyncio.get_running_loop().call_later(wait_s, self._paced_wake)

    def _paced_wake(self) -> None:
        self._paced = None
        if self.pending:  # else something else woke it meanwhile, and it took the text
            self.wake()

    @property
    def pending(self) -> bool:
        return self.generation.length > self.cursor or (
            self.generation.final_due() and not self._final_sent
        )

    async def events(self, keepalive_s: float) -> AsyncIterator[StreamEvent | None]:
        """Start, then coalesced deltas, then Final. Yields None after `keepalive_s` of silence.

        The keepalive is one timer per subscriber, re-armed when it fires, not a timeout per wait:
        arming and cancelling a timer for every token was ~8% of the event loop's work per token.
        """
        yield self.generation.start_event(self.cursor)
        loop = asyncio.get_running_loop()
        self._keepalive_s = keepalive_s
        self._keepalive = loop.call_later(keepalive_s, self._keepalive_due)
        try:
            while not self._final_sent:
                if not (self._idle or self._killed is not None or self.pending):
                    self._waiter = loop.create_future()
                    self._taking = True
                    try:
                        await self._waiter
                    finally:
                        self._taking = False
                        self._waiter = None
                if self._killed is not None:
                    return  # given up on: the stream ends without a Final (the client sees truncation)
                self._idle = False
                event = self._take()
                self._last_take = time.monotonic()
                yield event
        finally:
            self._keepalive.cancel()

    def _keepalive_due(self) -> None:
        """The keepalive timer fired: a heartbeat is due if nothing was taken for `keepalive_s`
        (else the timer sleeps until it would be)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        silent_for = time.monotonic() - self._last_take
        if silent_for >= self._keepalive_s * 0.999:  # timers may fire a hair early
            self._idle = True
            self.wake()
            self._keepalive = loop.call_later(self._keepalive_s, self._keepalive_due)
        else:
            self._keepalive = loop.call_later(self._keepalive_s - silent_for, self._keepalive_due)

    def _take(self) -> StreamEvent | None:
        generation = self.generation
        if generation.length > self.cursor:
            text = generation.text_since(self.cursor)
            merged = generation.parts_between(self.cursor, generation.length) - 1
            if merged:
                self.coalesced += merged
                self._coalesced_metric.inc(merged)
            self.cursor += len(text)
            self.sent_events += 1
            self._observe_delivery()
            return Delta(id=self.cursor, text=text)
        if generation.final_due():  # saved, or the save is slow: see app/streaming/saving.py
            self._final_sent = True
            return generation.final_event()
        return None  # idle: the caller sends a heartbeat

    def _observe_delivery(self) -> None:
        now = time.time()
        if self._last_delta_at is None:
            if self._from_start:  # a resumed stream's first event is no time-to-first-token
                self._ttft_metric.observe(now - self.generation.created_at)
        else:
            self._gap_metric.observe(now - self._last_delta_at)
        self._last_delta_at = now

    def stalled(self, now: float, deadline_s: float) -> bool:
        return (
            not self._taking
            and not self._final_sent
            and self.generation.length > self.cursor
            and now - self._last_take > deadline_s
        )

    def kill(self, cause: CancelCause) -> None:
        """The watchdog's verdict: this client is gone.

        The reply lets go of it at once (and is aborted, no grace, if nobody else reads it). The
        connection itself is left to end on its own: the consumer is stuck in a send, which
        returns when the client reads or leaves, and the stream then ends without a Final. Until
        then it costs its socket buffers, nothing more.
        """
        if self._killed is not None:
            return
        self._killed = cause
        if cause is CancelCause.DEADLINE:
            metrics.DEADLINE_ABORTS.inc()
        self._release()
        self.wake()
        self.generation.detach(self, gone=True, cause=cause)

    def close(self) -> None:
        """The connection ended. Before the Final event, that means the client went away."""
        self._release()
        if self._killed is None:
            self.generation.detach(self, gone=not self._final_sent, cause=CancelCause.DISCONNECT)

    def _release(self) -> None:
        if not self._closed:
            self._closed = True
            self._open_metric.dec()
            if self._keepalive is not None:
                self._keepalive.cancel()
            if self._paced is not None:
                self._paced.cancel()


async def live_events(
    generation: Generation, *, transport: str, after: int, keepalive_s: float
) -> AsyncGenerator[StreamEvent | None, None]:
    """One connection's events of a live reply (see `Subscriber.events`), however they end.

    The subscriber attaches when the stream is first read, so a stream never read holds nothing,
    and is closed in `finally`, synchronously: safe even while the connection is being cancelled.
    """
    subscriber = Subscriber(generation, transport=transport, after=after)
    try:
        async for event in subscriber.events(keepalive_s):
            yield event
    finally:
        subscriber.close()
