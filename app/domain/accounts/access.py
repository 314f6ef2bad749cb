"""Whether a session's user may still use the app: their account's state and session epoch.

A session holds a user id and the epoch it was made in (app/domain/accounts/login.py). Disabling,
deleting, resetting the password or "log out everywhere" changes the account's row (the state, or
a raised `session_epoch`); the session middleware asks this cache on each request and drops a
session that no longer matches. The cache reads a user's row at most once per `ttl_s` per process,
so a change takes effect on every replica within that time with no message between them, at the
cost of one primary-key read per active user and second (not one per request: requests that miss
together share one read, shared_reads.py).

`last_seen_at` is written from here too, at most once per LAST_SEEN_RESOLUTION, in a task of its
own: a request never waits for a write (SQLite's write lock may be held for seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from sqlalchemy import select, update

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts.models import User, UserState
from app.domain.accounts.shared_reads import SharedReads

log = logging.getLogger(__name__)

LAST_SEEN_RESOLUTION = timedelta(minutes=1)
MAX_ENTRIES = 10_000  # past it, expired entries are dropped


@dataclass(frozen=True, slots=True)
class Access:
    state: UserState
    epoch: int


@dataclass(slots=True)
class _Entry:
    access: Access | None  # None: no such user
    read_at: float


class AccessCache:
    def __init__(
        self, sessions: Sessions, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[UUID, _Entry] = {}
        self._reads: SharedReads[UUID, Access | None] = SharedReads()
        self._writes: set[asyncio.Task[None]] = set()

    async def get(self, user_id: UUID) -> Access | None:
        """The user's state and epoch, at most `ttl_s` old; None when there is no such user.
        When the database cannot be read, the last known answer stands (a user verified before
        an outage keeps working through it; nobody new gets in)."""
        now = self.clock()
        entry = self._entries.get(user_id)
        if entry is not None and now - entry.read_at < self.ttl_s:
            return entry.access
        try:
            return await self._reads.read(user_id, lambda: self._refresh(user_id, now))
        except Exception:
            if entry is None:
                raise
            log.warning("access check: the database could not be read; last answer kept")
            return entry.access

    async def _refresh(self, user_id: UUID, now: float) -> Access | None:
        access, last_seen = await self._read(user_id)
        if len(self._entries) >= MAX_ENTRIES:
            self._drop_expired(now)
        self._entries[user_id] = _Entry(access, now)
        if access is not None and (
            last_seen is None or utcnow() - last_seen >= LAST_SEEN_RESOLUTION
        ):
            self._touch(user_id)
        return access

    def forget(self, user_id: UUID) -> None:
        """Read the row again on the next request (after a change made by this process)."""
        self._entries.pop(user_id, None)
        self._reads.forget(user_id)

    async def _read(self, user_id: UUID) -> tuple[Access | None, datetime | None]:
        async with transaction(self.sessions) as session:
            row = (
                await session.execute(
                    select(User.state, User.session_epoch, User.last_seen_at).where(
                        User.id == user_id
                    )
                )
            ).one_or_none()
        if row is None:
            return None, None
        return Access(row.state, row.session_epoch), row.last_seen_at

    def _touch(self, user_id: UUID) -> None:
        task = asyncio.create_task(self._write_last_seen(user_id), name="last-seen")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_last_seen(self, user_id: UUID) -> None:
        try:
            async with transaction(self.sessions) as session:
                await session.execute(
                    update(User).where(User.id == user_id).values(last_seen_at=utcnow())
                )
        except Exception:
            log.warning("last seen: not written for %s", user_id, exc_info=True)

    def _drop_expired(self, now: float) -> None:
        for user_id in [u for u, e in self._entries.items() if now - e.read_at >= self.ttl_s]:
            del self._entries[user_id]

    async def close(self) -> None:
        """Let the last-seen writes in flight finish (before the database goes away)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
