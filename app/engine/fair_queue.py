"""The waiting queue of an engine: fair across owners, FIFO within one owner.

A plain FIFO lets one owner who sends 60 requests at once hold everybody else behind all 60. Here
the next request due is the oldest waiting one of the owner with the fewest requests running (ties:
the oldest waiting request overall), so a newcomer is admitted at the next free slot however long
someone else's backlog is, and owners with backlogs take turns. With one owner (or none: every
request without an owner shares one bucket) this is exactly FIFO.

Pure bookkeeping, shared by the llama.cpp scheduler and the synthetic engine: the caller says
when a request it popped stops running (`done`).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, owner_of: Callable[[T], Hashable]) -> None:
        self._owner_of = owner_of
        self._waiting: dict[Hashable, deque[tuple[int, T]]] = {}  # owner -> (ticket, item), FIFO
        self._running: Counter[Hashable] = Counter()  # owner -> items popped and not done
        self._tickets = itertools.count()  # arrival order, for ties and iteration
        self._members: set[int] = set()  # id() of every waiting item: `in` without a scan

    def append(self, item: T) -> None:
        owner = self._owner_of(item)
        self._waiting.setdefault(owner, deque()).append((next(self._tickets), item))
        self._members.add(id(item))

    def extend(self, items: Iterable[T]) -> None:
        for item in items:
            self.append(item)

    def _due_owner(self) -> Hashable:
        return min(
            self._waiting, key=lambda owner: (self._running[owner], self._waiting[owner][0][0])
        )

    def peek(self) -> T | None:
        """The request due next (None when nothing waits)."""
        if not self._waiting:
            return None
        return self._waiting[self._due_owner()][0][1]

    def pop(self) -> T:
        """Take the request due next; it counts as running for its owner until `done`."""
        if not self._waiting:
            raise IndexError("pop from an empty FairQueue")
        owner = self._due_owner()
        queue = self._waiting[owner]
        _, item = queue.popleft()
        if not queue:
            del self._waiting[owner]
        self._running[owner] += 1
        self._members.discard(id(item))
        return item

    def done(self, item: T) -> None:
        """A request `pop` returned stopped running."""
        owner = self._owner_of(item)
        self._running[owner] -= 1
        if self._running[owner] <= 0:
            del self._running[owner]

    def remove(self, item: T) -> None:
        """Drop a waiting request (an abort); ValueError if it is not waiting."""
        if id(item) not in self._members:
            raise ValueError("not waiting")
        owner = self._owner_of(item)
        queue = self._waiting[owner]
        for entry in queue:
            if entry[1] is item:
                queue.remove(entry)
                break
        if not queue:
            del self._waiting[owner]
        self._members.discard(id(item))

    def clear(self) -> None:
        self._waiting.clear()
        self._members.clear()

    def __contains__(self, item: object) -> bool:
        return id(item) in self._members

    def __iter__(self) -> Iterator[T]:
        """Every waiting request, in arrival order (not the order they will be admitted in)."""
        return (item for _, item in heapq.merge(*self._waiting.values(), key=lambda e: e[0]))

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)
