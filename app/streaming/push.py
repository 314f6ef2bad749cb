"""Each user's push channels: one per open page (its WebSocket, or its `GET /api/events` stream),
and the small events every page of that user must hear (a reply started elsewhere, a rename...).

The hub knows users only by an opaque key and events only as opaque payloads: what they mean is
the domain's (app/domain/chat/push_events.py). A channel's queue is bounded: a page that does not
keep up is not allowed to grow the server's memory, so on overflow its queue is dropped and the
page is told to refetch what it shows (`OVERFLOW`), which costs one request instead of N events.

A user's channels are bounded too (`max_per_user`, per process): one user opening a thousand pages
(or scripts subscribing in a loop) would have every event of theirs copied a thousand times, so a
new channel past the cap ends the user's oldest one, which hears EVICTED last. A channel can also
be ended with a last event of the caller's (`end`): the account was signed out.
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

EVICTED: Final = "evicted"
"""Yielded last by a channel the user's newer channels pushed out (past `max_per_user`)."""

DEFAULT_CAPACITY = 64


class PushChannel(Generic[T]):
    """One page's mailbox of events, bounded by `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: deque[T] = deque()
        self._overflowed = False
        self._wake = asyncio.Event()
        self._last: list[T | str] = []  # what `events` yields before it stops (after `end`)
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

    def end(self, last: T | str) -> None:
        """Stop the channel: what is queued is dropped, `events` yields `last` and ends."""
        if self.closed or self._last:
            return
        self._queue.clear()
        self._overflowed = False
        self._last.append(last)
        self._wake.set()

    async def events(self, keepalive_s: float) -> AsyncIterator[T | str | None]:
        """Queued events in order (OVERFLOW when some were dropped), and None after `keepalive_s`
        of silence (the transport sends a heartbeat); after `end`, its last event, then no more."""
        while not self.closed:
            if self._last:
                self.closed = True
                yield self._last[0]
                return
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
    """user key -> that user's open channels, oldest first. `publish` reaches only the channels of
    that key; past `max_per_user` channels of one key, a new one ends the oldest (EVICTED)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_per_user: int | None = None) -> None:
        self.capacity = capacity
        self.max_per_user = max_per_user
        self._channels: dict[str, dict[PushChannel[T], None]] = {}  # a dict keeps the order
        self.evicted = 0  # channels ended for being past the cap, since the start

    @contextlib.contextmanager
    def subscribe(self, user: str) -> Iterator[PushChannel[T]]:
        """A channel for one page of `user`, unsubscribed when the block ends (however it ends)."""
        channel: PushChannel[T] = PushChannel(self.capacity)
        if self.max_per_user is not None:
            while self.channel_count(user) >= max(1, self.max_per_user):
                self._drop(user, next(iter(self._channels[user])))
                self.evicted += 1
        self._channels.setdefault(user, {})[channel] = None
        try:
            yield channel
        finally:
            channel.closed = True
            self._drop(user, channel)

    def _drop(self, user: str, channel: PushChannel[T], last: T | str = EVICTED) -> None:
        """Unsubscribe `channel`; if it is still being read, it hears `last` and ends."""
        channel.end(last)
        mine = self._channels.get(user)
        if mine is not None:
            mine.pop(channel, None)
            if not mine:
                del self._channels[user]

    def end_user(self, user: str, last: T) -> int:
        """End every channel of `user`, each hearing `last`; returns how many there were."""
        channels = list(self._channels.get(user, ()))
        for channel in channels:
            self._drop(user, channel, last)
        return len(channels)

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
