"""The list of each user's sessions, on real SQLite and PostgreSQL
(app/domain/accounts/browser_sessions.py): rows made at log-in, ended one by one or all but one,
dead rows left out of the list and cleared at the next log-in, and the per-process check that
drops a session whose row is gone (and, with the account check, reads each row once for a burst
of requests that miss together)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.base import utcnow
from app.domain.accounts import browser_sessions, passwords
from app.domain.accounts import service as accounts
from app.domain.accounts.access import AccessCache
from app.domain.accounts.models import BrowserSession, User
from app.domain.accounts.user_agents import browser_name

Sessions = async_sessionmaker[AsyncSession]
MakeUser = Callable[..., Awaitable[User]]
CHROME = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)


async def fresh(sessions: Sessions, user: User) -> User:
    found = await accounts.get_user(sessions, user.id)
    assert found is not None
    return found


async def test_sessions_are_listed_per_user_and_ended_one_by_one(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    alice, bob = await make_user(), await make_user()
    first = await browser_sessions.start(db_sessions, alice, CHROME, "192.0.2.1")
    second = await browser_sessions.start(db_sessions, alice, "curl/8.5.0", "192.0.2.2")
    await browser_sessions.start(db_sessions, bob, CHROME, "192.0.2.3")

    listed = await browser_sessions.list_live(db_sessions, alice)
    assert {row.id for row in listed} == {first, second}
    assert {row.address for row in listed} == {"192.0.2.1", "192.0.2.2"}

    assert not await browser_sessions.end(db_sessions, bob.id, first)  # not bob's
    assert await browser_sessions.end(db_sessions, alice.id, first)
    assert not await browser_sessions.end(db_sessions, alice.id, first)  # gone already
    assert [row.id for row in await browser_sessions.list_live(db_sessions, alice)] == [second]


async def test_ending_the_others_raises_the_epoch_and_keeps_one(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    user = await make_user()
    keep, *others = [
        await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.1") for _ in range(3)
    ]
    epoch = await browser_sessions.end_others(db_sessions, user.id, keep)
    assert epoch == user.session_epoch + 1
    user = await fresh(db_sessions, user)
    assert user.session_epoch == epoch
    assert [row.id for row in await browser_sessions.list_live(db_sessions, user)] == [keep]

    # With a new password: set in the same transaction, the old one no longer works.
    old_hash = user.password_hash
    epoch = await browser_sessions.end_others(
        db_sessions, user.id, keep, new_password="a new and longer passphrase"
    )
    user = await fresh(db_sessions, user)
    assert user.session_epoch == epoch and user.password_hash != old_hash
    assert await passwords.verify_password(user.password_hash, "a new and longer passphrase")
    assert await browser_sessions.end_others(db_sessions, user.id, keep) is not None
    assert len(others) == 2


async def test_dead_rows_are_not_listed_and_go_at_the_next_log_in(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    user = await make_user()
    stale = await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.1")
    async with db_sessions.begin() as session:
        await session.execute(
            update(BrowserSession)
            .where(BrowserSession.id == stale)
            .values(last_seen_at=utcnow() - browser_sessions.SESSION_MAX_AGE - timedelta(hours=1))
        )
    old_epoch = await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.2")
    async with db_sessions.begin() as session:  # an admin's "log out everywhere"
        await session.execute(
            update(User).where(User.id == user.id).values(session_epoch=User.session_epoch + 1)
        )
    user = await fresh(db_sessions, user)
    assert await browser_sessions.list_live(db_sessions, user) == []

    current = await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.3")
    assert [row.id for row in await browser_sessions.list_live(db_sessions, user)] == [current]
    for gone in (stale, old_epoch):
        assert not await browser_sessions.end(db_sessions, user.id, gone)


async def test_a_session_whose_row_is_gone_is_dropped(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    user = await make_user()
    row = await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.1")
    now = [0.0]
    live = browser_sessions.LiveSessions(db_sessions, ttl_s=1.0, clock=lambda: now[0])
    assert await live.alive(row)
    await browser_sessions.end(db_sessions, user.id, row)
    assert await live.alive(row)  # within a second, the answer read before stands
    now[0] = 1.5
    assert not await live.alive(row)
    await live.close()


async def test_a_burst_that_misses_the_checks_together_reads_each_row_once(
    db_engine: AsyncEngine, db_sessions: Sessions, make_user: MakeUser
) -> None:
    """A burst of one session's requests finds both per-request checks expired at once: one
    read of the account's row and one of the session's, not one per request."""
    user = await make_user()
    row = await browser_sessions.start(db_sessions, user, CHROME, "192.0.2.1")
    live = browser_sessions.LiveSessions(db_sessions, ttl_s=1.0)
    access = AccessCache(db_sessions, ttl_s=1.0)
    selects: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)

    event.listen(db_engine.sync_engine, "before_cursor_execute", count)
    answers = await asyncio.gather(
        *(live.alive(row) for _ in range(50)), *(access.get(user.id) for _ in range(50))
    )
    assert answers[:50] == [True] * 50
    assert {a.epoch for a in answers[50:] if a is not None} == {user.session_epoch}
    assert len(selects) == 2, selects
    access.forget(user.id)  # after a change: the next one reads again
    await access.get(user.id)
    assert len(selects) == 3
    await live.close()
    await access.close()


def test_browser_names() -> None:
    assert browser_name(CHROME) == "Chrome on Windows"
    firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
    assert browser_name(firefox) == "Firefox on Linux"
    edge = CHROME + " Edg/131.0.0.0"
    assert browser_name(edge) == "Edge on Windows"
    safari = (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
    )
    assert browser_name(safari) == "Safari on iOS"
    assert browser_name("curl/8.5.0") == "curl"
    assert browser_name("python-httpx/0.28.1") == "Python"
    assert browser_name("") == "Unknown browser"
    assert browser_name("<script>/1") == "<script>"  # shown as text by the page
