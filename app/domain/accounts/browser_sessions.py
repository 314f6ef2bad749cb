"""Each user's logged-in browsers: one row per session (models.BrowserSession), so that the account
page can list them and end one, and the ones not this one, on every replica.

The row's id lives in the server-side session (SID_KEY, written at log-in); the session store's own
key is never written to the database. Ending a session deletes its row: the session middleware
asks `LiveSessions` whether a session's row is still there (one read per session and second per
process, the same bound as the account check in access.py) and drops the session when it is not.
Ending every other session also raises the account's `session_epoch` (as "log out everywhere"
does), and this session takes the new epoch along, so it stays.

Rows whose epoch is older than the account's, or unseen for longer than a session lives, belong to
sessions that ended some other way (an admin's "log out everywhere", a reset, expiry): they are not
listed, and are deleted at the user's next log-in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from sqlalchemy import delete, or_, select, update

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts import passwords
from app.domain.accounts.models import BrowserSession, User
from app.domain.accounts.shared_reads import SharedReads

log = logging.getLogger(__name__)

SESSION_MAX_AGE = timedelta(days=14)
"""How long an unused session lives (the session cookie's and the store's max age)."""
LAST_SEEN_RESOLUTION = timedelta(minutes=1)
MAX_ENTRIES = 50_000


def _cutoff() -> datetime:
    return utcnow() - SESSION_MAX_AGE


async def start(sessions: Sessions, user: User, user_agent: str, address: str) -> UUID:
    """A row for a session being logged in as `user`; its id, for the session to hold. The user's
    dead rows (an older epoch, expired) go in the same transaction."""
    row = BrowserSession(
        user_id=user.id,
        epoch=user.session_epoch,
        user_agent=user_agent[:300],
        address=address[:64],
    )
    async with transaction(sessions) as session:
        await session.execute(
            delete(BrowserSession).where(
                BrowserSession.user_id == user.id,
                or_(
                    BrowserSession.epoch != user.session_epoch,
                    BrowserSession.last_seen_at < _cutoff(),
                ),
            )
        )
        session.add(row)
    return row.id


async def list_live(sessions: Sessions, user: User) -> list[BrowserSession]:
    """The user's sessions still in use, the most recently seen first."""
    async with transaction(sessions) as session:
        rows = await session.scalars(
            select(BrowserSession)
            .where(
                BrowserSession.user_id == user.id,
                BrowserSession.epoch == user.session_epoch,
                BrowserSession.last_seen_at >= _cutoff(),
            )
            .order_by(BrowserSession.last_seen_at.desc(), BrowserSession.created_at.desc())
        )
        return list(rows)


async def end(sessions: Sessions, user_id: UUID, session_id: UUID) -> bool:
    """End one of `user_id`'s sessions; False when there is no such session of theirs."""
    async with transaction(sessions) as session:
        result = await session.execute(
            delete(BrowserSession).where(
                BrowserSession.id == session_id, BrowserSession.user_id == user_id
            )
        )
        return result.rowcount > 0


async def end_others(
    sessions: Sessions, user_id: UUID, keep: UUID | None, *, new_password: str | None = None
) -> int | None:
    """End every session of the user's but `keep` (and, with `new_password`, set it in the same
    transaction). Returns the account's new epoch, which the kept session must take; None when
    there is no such user."""
    values: dict[str, object] = {"session_epoch": User.session_epoch + 1}
    if new_password is not None:
        passwords.check_password_strength(new_password)
        values["password_hash"] = await passwords.hash_password(new_password)
    async with transaction(sessions) as session:
        epoch = await session.scalar(
            update(User).where(User.id == user_id).values(**values).returning(User.session_epoch)
        )
        if epoch is None:
            return None
        others = delete(BrowserSession).where(BrowserSession.user_id == user_id)
        if keep is not None:
            others = others.where(BrowserSession.id != keep)
            await session.execute(
                update(BrowserSession)
                .where(BrowserSession.id == keep, BrowserSession.user_id == user_id)
                .values(epoch=epoch)
            )
        await session.execute(others)
        return epoch


class LiveSessions:
    """Whether a session's row still exists, read at most once per `ttl_s` per process; also
    stamps the row's `last_seen_at`, at most once per LAST_SEEN_RESOLUTION, off the request."""

    def __init__(
        self, sessions: Sessions, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[UUID, tuple[bool, float]] = {}
        self._reads: SharedReads[UUID, bool] = SharedReads()  # concurrent misses read once
        self._writes: set[asyncio.Task[None]] = set()

    async def alive(self, session_id: UUID) -> bool:
        """False once the row is gone. When the database cannot be read, the last answer stands,
        or True for a session not seen before (the account check has passed already)."""
        now = self.clock()
        entry = self._entries.get(session_id)
        if entry is not None and now - entry[1] < self.ttl_s:
            return entry[0]
        try:
            return await self._reads.read(session_id, lambda: self._refresh(session_id, now))
        except Exception:
            log.warning("session check: the database could not be read; last answer kept")
            return entry[0] if entry is not None else True

    async def _refresh(self, session_id: UUID, now: float) -> bool:
        async with transaction(self.sessions) as session:
            last_seen = await session.scalar(
                select(BrowserSession.last_seen_at).where(BrowserSession.id == session_id)
            )
        if len(self._entries) >= MAX_ENTRIES:
            self._entries = {k: v for k, v in self._entries.items() if now - v[1] < self.ttl_s}
        self._entries[session_id] = (last_seen is not None, now)
        if last_seen is not None and utcnow() - last_seen >= LAST_SEEN_RESOLUTION:
            task = asyncio.create_task(self._touch(session_id), name="session-last-seen")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return last_seen is not None

    def forget(self, session_id: UUID) -> None:
        self._entries.pop(session_id, None)
        self._reads.forget(session_id)

    async def _touch(self, session_id: UUID) -> None:
        try:
            async with transaction(self.sessions) as session:
                await session.execute(
                    update(BrowserSession)
                    .where(BrowserSession.id == session_id)
                    .values(last_seen_at=utcnow())
                )
        except Exception:
            log.warning("session last seen: not written for %s", session_id, exc_info=True)

    async def close(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
