"""The hand-off from an engine loop to asyncio: one `EventStream` per request.

The engine side never waits: `push` only appends (call it on the event loop's thread, e.g. through
`loop.call_soon_threadsafe` from an engine thread, ideally once per step for all streams at once).
The consumer side is an async iterator that ends after the `Finished` event. A consumer that stops
early (`aclose`, or garbage collection of an abandoned `async for`) aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

from app.engine.base import EngineEvent, Finished


class EventStream:
    __slots__ = ("_events", "_finished", "_forward", "_on_abandon", "_waiter", "request_id")

    def __init__(self, request_id: str, on_abandon: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._events: deque[EngineEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False  # a Finished event has been pushed
        self._on_abandon = on_abandon
        # (on_event, the future of the Finished) while events are forwarded: see `forward_to`
        self._forward: tuple[Callable[[EngineEvent], None], asyncio.Future[Finished]] | None = None

    @property
    def finished(self) -> bool:
        return self._finished

    def push(self, event: EngineEvent) -> None:
        """Append an event. Must run on the event loop's thread. Never blocks."""
        if self._finished:
            return  # exactly one Finished, and nothing after it
        if isinstance(event, Finished):
            self._finished = True
        if self._forward is not None:
            self._hand_over(event)
            return
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def forward_to(self, on_event: Callable[[EngineEvent], None]) -> asyncio.Future[Finished]:
        """Hand each event to `on_event` as it is pushed (events already queued first) instead of
        queueing it for `async for`. For a consumer that only files events away: it saves a task
        wake-up per token, which at GPU rates was a third of the event loop's work. The future
        resolves to the Finished (after the events before it were handed over), or fails with
        what `on_event` raised, and then the stream counts as ended: nothing more is handed over.
        """
        if self._forward is not None:
            raise RuntimeError(f"{self.request_id}: events are already forwarded")
        done: asyncio.Future[Finished] = asyncio.get_running_loop().create_future()
        self._forward = (on_event, done)
        while self._events and self._forward is not None:
            self._hand_over(self._events.popleft())
        return done

    def _hand_over(self, event: EngineEvent) -> None:
        assert self._forward is not None
        on_event, done = self._forward
        if isinstance(event, Finished):
            self._forward = None
            if not done.done():
                done.set_result(event)
            return
        try:
            on_event(event)
        except Exception as exc:  # the consumer's bug: it hears of it once, then nothing more
            self._forward = None
            self._finished = True
            self._events.clear()
            if not done.done():
                done.set_exception(exc)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> EngineEvent:
        while not self._events:
            if self._finished:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._events.popleft()
        return event

    async def aclose(self) -> None:
        """The consumer is done: if the request is still running, abort it."""
        if not self._finished:
            self._on_abandon(self.request_id)
        self._events.clear()


def hop_to_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> bool:
    """Called from another thread: schedule `callback(*args)` on `loop` without waiting (a closed
    loop has nothing left to do, so then it is dropped) and return True. On the loop's own thread,
    do nothing and return False: the caller carries on there."""
    try:
        if asyncio.get_running_loop() is loop:
            return False
    except RuntimeError:  # no running loop in this thread
        pass
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)
    return True
