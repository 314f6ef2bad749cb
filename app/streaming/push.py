"""Each user's push channels: one per open page (its WebSocket, or its `GET /api/events` stream),
and the small events every page of that user must hear (a reply started elsewhere, a rename...).

The hub knows users only by an opaque key and events only as opaque payloads: what they mean is
the domain's (app/domain/chat/push_events.py). A channel's queue is bounded: a page that does not
keep up is not allowed to grow the server's memory, so on overflow its queue is dropped and the
page is told to refetch what it shows (`OVERFLOW`), which costs one request instead of N events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Final, Generic, TypeVar

T = TypeVar("T")

OVERFLOW: Final = "overflow"
"""Yielded by `PushChannel.events` in place of the events a slow page lost: refetch everything."""

DEFAULT_CAPACITY = 64


class PushChannel(Generic[T]):
    """One page's mailbox of events, bounded by `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: deque[T] = deque()
        self._overflowed = False
        self._wake = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._queue)

    def offer(self, event: T) -> None:
        """Queue `event` without ever waiting; past `capacity` the backlog is dropped for one
        OVERFLOW (everything it held is stale once the page refetches)."""
        if self.closed:
            return
        if self._overflowed:
            pass  # the page refetches anyway: nothing queued after the overflow is needed
        elif len(self._queue) >= self.capacity:
            self._queue.clear()
            self._overflowed = True
        else:
            self._queue.append(event)
        self._wake.set()

    async def events(self, keepalive_s: float) -> AsyncIterator[T | str | None]:
        """Queued events in order (OVERFLOW when some were dropped), and None after `keepalive_s`
        of silence (the transport sends a heartbeat)."""
        while not self.closed:
            if self._overflowed:
                self._overflowed = False
                yield OVERFLOW
                continue
            if self._queue:
                yield self._queue.popleft()
                continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), keepalive_s)
            except TimeoutError:
                yield None


class PushHub(Generic[T]):
    """user key -> that user's open channels. `publish` reaches only the channels of that key."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._channels: dict[str, set[PushChannel[T]]] = {}

    @contextlib.contextmanager
    def subscribe(self, user: str) -> Iterator[PushChannel[T]]:
        """A channel for one page of `user`, unsubscribed when the block ends (however it ends)."""
        channel: PushChannel[T] = PushChannel(self.capacity)
        self._channels.setdefault(user, set()).add(channel)
        try:
            yield channel
        finally:
            channel.closed = True
            mine = self._channels.get(user)
            if mine is not None:
                mine.discard(channel)
                if not mine:
                    del self._channels[user]

    def publish(self, user: str, event: T) -> int:
        """Offer `event` to every open channel of `user`; returns how many there were."""
        channels = self._channels.get(user, ())
        for channel in channels:
            channel.offer(event)
        return len(channels)

    def channel_count(self, user: str | None = None) -> int:
        if user is not None:
            return len(self._channels.get(user, ()))
        return sum(len(c) for c in self._channels.values())
