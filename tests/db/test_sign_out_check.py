"""The once-a-second check behind sign-outs (app/domain/chat/sign_outs.py, `SignOuts.sweep`), on
real SQLite and PostgreSQL: what no message announced (a change made straight in the database, a
NOTIFY lost while the listening connection was being re-opened) is still found from the account's
row. A socket (or event stream) opened with an ended session is closed, one opened since stays;
a disabled account's sockets and push channels all end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts import management
from app.domain.accounts.access import AccessCache
from app.domain.accounts.audit import CLI
from app.domain.accounts.models import User
from app.domain.chat.push_events import SignedOut, UserPush
from app.domain.chat.sign_outs import SignOuts
from app.engine.synthetic.engine import SyntheticEngine
from app.streaming.manager import GenerationManager
from app.streaming.push import PushHub
from tests.streaming.core import MemoryLedger, engine_settings


async def test_the_check_finds_ended_sessions_and_disabled_accounts(
    db_sessions: async_sessionmaker[AsyncSession], make_user: Callable[..., Awaitable[User]]
) -> None:
    ann = await make_user("ann@example.com")
    ben = await make_user("ben@example.com")
    manager = GenerationManager(SyntheticEngine(engine_settings()), MemoryLedger())  # idle
    push = UserPush(PushHub(), manager)
    sign_outs = SignOuts(manager, push, AccessCache(db_sessions, ttl_s=0))
    closed: list[tuple[str, str]] = []

    def closer(name: str) -> Callable[[str], None]:
        return lambda why: closed.append((name, why))

    with (
        sign_outs.watch(ann.id, ann.session_epoch, closer("ann's old page")),
        sign_outs.watch(ben.id, ben.session_epoch, closer("ben's page")),
        push.hub.subscribe(str(ben.id)) as bens_channel,
    ):
        old_stream = sign_outs.page_events(ann.id, ann.session_epoch, keepalive_s=5)
        assert await anext(old_stream) is None  # subscribed (a `GET /api/events`)
        await sign_outs.sweep()
        assert closed == []

        await management.end_sessions(db_sessions, CLI, ann.id)  # nobody told this process
        await sign_outs.sweep()
        assert closed == [("ann's old page", "logged_out")]
        assert [e async for e in old_stream] == [SignedOut("logged_out")]
        assert push.hub.channel_count(str(ann.id)) == 0
        with sign_outs.watch(ann.id, ann.session_epoch + 1, closer("ann's new page")):
            await sign_outs.sweep()
            await sign_outs.sweep()
            assert closed == [("ann's old page", "logged_out")]  # a session made since stays

        await management.disable(db_sessions, CLI, ben.id)
        await sign_outs.sweep()
        assert closed[1:] == [("ben's page", "disabled")]
        assert [e async for e in bens_channel.events(keepalive_s=5)] == [SignedOut("disabled")]
        await sign_outs.sweep()
        assert len(closed) == 2  # each socket is closed once
