"""Each user's writes take turns: at most `WRITES_PER_USER` of one user's writing requests are
handled at once; the others wait here, before they cost anything else.

Without it, one user's burst (a script, a stuck retry loop: 400 writes at once) fills the event
loop with 400 handlers, takes every pooled database connection and queues on SQLite's one write
lock, and another user's request waits seconds behind it (measured by
tests/serving/test_live_write_bursts.py, 400 writes at once: another user's POST took up to 1.3 s
on SQLite and 4.3 s on PostgreSQL; with turns, at most 0.3 s and 0.17 s, 13-19 ms at the median).
Waiting in line costs the burst's own requests a little latency each, and nobody else anything.

Only short requests take turns: reads (GET, HEAD, OPTIONS) are not limited, nor routes whose
answer lasts as long as a reply (their `opt` is app/domain/sse.py's `LONG_LIVED`: the page's
sends and Stop; the WebSocket is not HTTP), nor requests without a session user (`/v1`
authenticates by API key further in, and the reply service limits its replies per user).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from app.domain.sse import LONG_LIVED

WRITES_PER_USER = 2

_READS = {"GET", "HEAD", "OPTIONS"}


class Turns:
    """At most `per_key` holders per key at once; the others wait in line (first come, first
    served: asyncio's semaphores wake waiters in order)."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._slots: dict[Hashable, asyncio.Semaphore] = {}
        self._users: Counter[Hashable] = Counter()  # holders and waiters, to forget idle keys

    @asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        slots = self._slots.setdefault(key, asyncio.Semaphore(self.per_key))
        self._users[key] += 1
        try:
            async with slots:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._slots[key]


class UserWriteTurns(ASGIMiddleware):
    """Installed after the session authentication, which sets `scope["user"]` (the user's id)."""

    scopes = (ScopeType.HTTP,)
    exclude_opt_key = next(iter(LONG_LIVED))

    def __init__(self, per_user: int = WRITES_PER_USER) -> None:
        self.turns = Turns(per_user)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        user = scope.get("user")
        if user is None or scope.get("method") in _READS:
            await next_app(scope, receive, send)
        else:
            async with self.turns.turn(user):
                await next_app(scope, receive, send)
