"""One read in flight per key: the callers that miss a cache together share it.

The per-request checks (access.py, browser_sessions.py) read a row at most once per second and
key, but only once a read has landed: a burst of a user's requests that finds the entry expired
would each read it (and each note the user as seen), every one holding a pooled connection.
Measured on a burst of 1,024 page sends from one session (bench/serving_overhead.py): ~200 reads
of each kind where one would do. With `SharedReads` the first caller reads, the others wait for
its answer (or its error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedReads(Generic[K, V]):
    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[V]] = {}

    async def read(self, key: K, read: Callable[[], Awaitable[V]]) -> V:
        """`read()`'s answer, or that of the read of `key` already in flight. A caller that is
        cancelled leaves the read running for the others (`shield`)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(read())
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight)

    def _landed(self, key: K, flight: asyncio.Future[V]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]

    def forget(self, key: K) -> None:
        """Callers from now on start a fresh read (the one in flight may predate a change)."""
        self._flights.pop(key, None)

    def __len__(self) -> int:
        return len(self._flights)
