"""A subscriber is one connection's view of a Generation: a mailbox, not a queue of tokens.

It holds only a cursor (a character offset) into the Generation's text. Whatever arrived since the
connection last took an event leaves as ONE delta, so a slow socket gets fewer, larger events and
the memory a client costs does not grow with how far behind it is. The engine never waits for it.

A connection reads it through `follow_live` (below): Start, Delta..., Final, and None when idle
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
        self._wake = asyncio.Event()
        self._last_take = time.monotonic()
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
        self._wake.set()

    @property
    def pending(self) -> bool:
        return self.generation.length > self.cursor or (
            self.generation.final_due() and not self._final_sent
        )

    async def events(self, keepalive_s: float) -> AsyncIterator[StreamEvent | None]:
        """Start, then coalesced deltas, then Final. Yields None after `keepalive_s` of silence."""
        yield self.generation.start_event(self.cursor)
        while not self._final_sent:
            self._taking = True
            try:
                await self._wait(keepalive_s)
            finally:
                self._taking = False
            if self._killed is not None:
                return  # given up on: the stream ends without a Final (the client sees truncation)
            event = self._take()
            self._last_take = time.monotonic()
            yield event

    async def _wait(self, keepalive_s: float) -> None:
        if self.pending or self._killed is not None:
            return
        self._wake.clear()
        try:
            async with asyncio.timeout(keepalive_s):  # a timer, not a task per wait
                await self._wake.wait()
        except TimeoutError:
            pass

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

        The reply lets go of it at once (and is aborted, no grace, if nobody else follows it). The
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
        self._wake.set()
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


async def follow_live(
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
