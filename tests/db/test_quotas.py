"""Token quotas on real SQLite and PostgreSQL (app/domain/quotas/): the counter, the conditional
reservation (no overshoot past one reply under concurrent starts), the settling that rides on a
reply's final save (cancelled ends counted too), the month's limit over several days, and an
admin's override (audited, in force at the next start)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta

import msgspec
import pytest
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.cancel_channel import LocalCancelChannel
from app.db.session import transaction
from app.domain.accounts import audit, management
from app.domain.accounts.models import AuditEntry, User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.prompts import turns as prompts
from app.domain.chat.replies.ledger import DatabaseLedger
from app.domain.errors import InvalidInputError
from app.domain.quotas import counter, overrides
from app.domain.quotas.models import QuotaUsage
from app.domain.quotas.service import Limits, QuotaExceededError, Quotas
from app.streaming.events import Status
from app.streaming.manager import ReplyRows
from tests.db.chat_rows import Sessions, add_turn, outcome, reload

ADMIN = audit.Actor(None, "admin@example.com", "127.0.0.1")


async def tokens_on(sessions: Sessions, user: User, day: date) -> int:
    async with sessions() as session:
        row = await session.get(QuotaUsage, (user.id, day))
        return 0 if row is None else row.tokens


def today() -> date:
    return datetime.now(UTC).date()


async def test_a_reservation_counts_until_the_limit_then_refuses_with_the_reset_time(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    user = await make_user()
    quotas = Quotas(db_sessions, Limits(per_day=100, per_month=0))
    first = await quotas.reserve(user.id, 60)
    assert (first.tokens, await tokens_on(db_sessions, user, today())) == (60, 60)
    await quotas.reserve(user.id, 60)  # 60 < 100: admitted, the counter goes past the limit
    assert await tokens_on(db_sessions, user, today()) == 120
    with pytest.raises(QuotaExceededError) as refused:
        await quotas.reserve(user.id, 1)
    error = refused.value
    midnight = datetime.combine(today() + timedelta(days=1), datetime.min.time(), UTC)
    assert (error.status, error.period, error.limit, error.resets_at) == (429, "day", 100, midnight)
    assert midnight.strftime("%Y-%m-%d 00:00 UTC") in error.public_message
    assert 0 < int(error.headers["Retry-After"]) <= 86_401
    assert await tokens_on(db_sessions, user, today()) == 120  # a refusal reserves nothing

    await quotas.release(first)  # a reply that never started gives its reservation back
    assert await tokens_on(db_sessions, user, today()) == 60
    state = await quotas.status(user.id)
    assert state is not None
    view = msgspec.structs.asdict(state.view())
    assert view | {"day_resets_at": None, "month_resets_at": None} == {
        "per_day": 100,
        "per_month": None,
        "used_day": 60,
        "used_month": 60,
        "left_day": 40,
        "left_month": None,
        "day_resets_at": None,
        "month_resets_at": None,
        "low": False,
    }
    assert view["month_resets_at"] == datetime.combine(
        (today().replace(day=28) + timedelta(days=4)).replace(day=1), datetime.min.time(), UTC
    )


async def test_concurrent_reservations_stop_within_one_reply_of_the_limit(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    """24 starts at once, each reserving 30 tokens against 100: exactly four get in (the counter
    under 100 before each), so the total stays under the limit plus one reply."""
    user = await make_user()
    quotas = Quotas(db_sessions, Limits(per_day=100, per_month=1000))
    results = await asyncio.gather(
        *(quotas.reserve(user.id, 30) for _ in range(24)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, QuotaExceededError)]
    assert len(admitted) + len(refused) == 24, [r for r in results if isinstance(r, Exception)]
    assert len(admitted) == 4
    assert await tokens_on(db_sessions, user, today()) == 120 < 100 + 30


async def test_the_month_counts_the_earlier_days(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    user = await make_user()
    moment = datetime(2026, 3, 15, 12, tzinfo=UTC)
    async with transaction(db_sessions) as session:  # last month's and yesterday's use
        last_month = [{"user": user.id, "day": date(2026, 2, 28), "delta": 5000}]
        await counter.add(
            session, [*last_month, {"user": user.id, "day": date(2026, 3, 14), "delta": 950}]
        )
    quotas = Quotas(db_sessions, Limits(per_day=0, per_month=1000), clock=lambda: moment)
    await quotas.reserve(user.id, 40)  # 950 + 0 < 1000
    with pytest.raises(QuotaExceededError) as refused:
        await quotas.reserve(user.id, 40)  # 950 + 40 < 1000 too, ...
        await quotas.reserve(user.id, 40)  # ... but 950 + 80 is not
    assert refused.value.period == "month"
    assert refused.value.resets_at == datetime(2026, 4, 1, tzinfo=UTC)
    assert "2026-04-01 00:00 UTC (in 16 d 12 h)" in refused.value.public_message


async def test_the_final_save_settles_the_reservation_to_the_engines_usage(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    """In the ends' own transaction: a cancelled reply counts what it used; a user with no limit
    has nothing reserved and is counted all the same; a deleted user's end still saves."""
    limited, unlimited = await make_user("l@example.com"), await make_user("u@example.com")
    quotas = Quotas(db_sessions, Limits(per_day=1000, per_month=0))
    await overrides.set_limits(db_sessions, ADMIN, unlimited.id, 0, None)
    ledger = DatabaseLedger(db_sessions, LocalCancelChannel(), quotas=quotas)
    ends, replies = [], []
    for user, status, tokens in ((limited, "cancelled", (12, 5)), (unlimited, "completed", (7, 9))):
        chat = await conversations.create_conversation(db_sessions, user.id, "t")
        _, reply = await add_turn(db_sessions, chat.id, "q", "m")
        quotas.hold(str(reply.id), await quotas.reserve(user.id, 300))
        replies.append(reply.id)
        ends.append(outcome(reply.id, status, prompt_tokens=tokens[0], completion_tokens=tokens[1]))
    assert await tokens_on(db_sessions, limited, today()) == 300
    assert await tokens_on(db_sessions, unlimited, today()) == 0  # no limit: nothing reserved
    await ledger.save_finals(ends)
    assert await tokens_on(db_sessions, limited, today()) == 17
    assert await tokens_on(db_sessions, unlimited, today()) == 16
    assert (await reload(db_sessions, replies[0])).status == Status.CANCELLED
    await ledger.save_finals(ends)  # settled once: a second save of the same ends adds nothing
    assert await tokens_on(db_sessions, limited, today()) == 17

    chat = await conversations.create_conversation(db_sessions, limited.id, "t")
    _, reply = await add_turn(db_sessions, chat.id, "q", "m")
    quotas.hold(str(reply.id), await quotas.reserve(limited.id, 300))
    await management.delete_user(db_sessions, ADMIN, limited.id)
    await ledger.save_finals([outcome(reply.id, "disconnected", prompt_tokens=3)])  # no raise
    async with db_sessions() as session:
        assert not list(
            await session.scalars(select(QuotaUsage).where(QuotaUsage.user_id == limited.id))
        )


async def test_an_admins_override_is_audited_and_in_force_at_the_next_start(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    user = await make_user()
    quotas = Quotas(db_sessions, Limits(per_day=50, per_month=0))
    await quotas.reserve(user.id, 60)
    with pytest.raises(QuotaExceededError):
        await quotas.reserve(user.id, 1)
    await overrides.set_limits(db_sessions, ADMIN, user.id, 500, 2000)
    await quotas.reserve(user.id, 1)
    state = await quotas.status(user.id)
    assert state is not None and state.limits == Limits(500, 2000)
    await overrides.set_limits(db_sessions, ADMIN, user.id, None, None)  # back to the defaults
    with pytest.raises(QuotaExceededError):
        await quotas.reserve(user.id, 1)
    with pytest.raises(InvalidInputError):
        await overrides.set_limits(db_sessions, ADMIN, user.id, -1, None)
    async with db_sessions() as session:
        entries = list(
            await session.scalars(
                select(AuditEntry)
                .where(AuditEntry.action == "quota")
                .order_by(AuditEntry.created_at)
            )
        )
    assert [e.target_id for e in entries] == [user.id, user.id]
    assert '"after": {"per_day": 500, "per_month": 2000}' in entries[0].detail
    assert '"before": {"per_day": null, "per_month": null}' in entries[0].detail
    assert entries[0].actor_email == "admin@example.com" and entries[0].address == "127.0.0.1"


def test_form_limits_read_as_the_users_page_sends_them() -> None:
    assert overrides.parse_form_limit("  ", "per_day") is None
    assert overrides.parse_form_limit("10,000", "per_day") == 10_000
    assert overrides.parse_form_limit("0", "per_day") == 0
    for bad in ("-5", "1e3", "ten", str(overrides.MAX_LIMIT + 1)):
        with pytest.raises(InvalidInputError):
            overrides.parse_form_limit(bad, "per_day")


async def test_a_sends_reservation_commits_or_rolls_back_with_its_turn(
    db_sessions: Sessions, make_user: Callable[..., Awaitable[User]]
) -> None:
    """`admit` with the send's session: checked before the engine, taken just before the turn's
    rows in the same transaction; a turn that is not committed takes its reservation with it."""
    user = await make_user()
    quotas = Quotas(db_sessions, Limits(per_day=100, per_month=0))
    written: list[str] = []

    async def persist(request_id: str) -> ReplyRows:
        written.append(request_id)
        return ReplyRows("m", "c", "q")

    for commit in (False, True):
        async with db_sessions() as session:
            admitted = await quotas.admit(user.id, 70, persist, session)
            assert admitted.reservation is None  # not yet: with the turn's rows
            await admitted.persist("r")
            assert admitted.reservation is not None and admitted.reservation.tokens == 70
            if commit:
                await session.commit()
        assert await tokens_on(db_sessions, user, today()) == (70 if commit else 0)
    async with db_sessions() as session:  # 70 < 100: checked in, but refused when taken...
        admitted = await quotas.admit(user.id, 70, persist, session)
        async with transaction(db_sessions) as other:  # ...as another reply took the rest
            await counter.add(other, [{"user": user.id, "day": today(), "delta": 40}])
        with pytest.raises(QuotaExceededError):
            await admitted.persist("r")
    assert written == ["r", "r"]  # the refused turn wrote nothing
    async with db_sessions() as session:  # used up: refused before the engine is asked
        with pytest.raises(QuotaExceededError):
            await quotas.admit(user.id, 1, persist, session)


async def test_a_send_reads_no_usage_when_no_limit_applies(
    db_engine: AsyncEngine,
    db_sessions: Sessions,
    make_user: Callable[..., Awaitable[User]],
) -> None:
    """The send's own query reads the user's overrides (`next_turn`); with neither they nor the
    defaults setting a limit, `admit` makes no query at all. A limit from either is still read
    and enforced."""
    user = await make_user()
    conversation = await conversations.create_conversation(db_sessions, user.id, "c")
    async with db_sessions() as session:
        turn = await prompts.next_turn(session, user.id, conversation.id)
    assert turn.quota_overrides == (None, None)
    statements: list[str] = []
    event.listen(db_engine.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    async def persist(request_id: str) -> ReplyRows:
        return ReplyRows("m", "c", "q")

    unlimited = Quotas(db_sessions, Limits(per_day=0, per_month=0))
    async with db_sessions() as session:
        admitted = await unlimited.admit(user.id, 70, persist, session, turn.quota_overrides)
        await admitted.persist("r")
    assert statements == []
    assert admitted.reservation is not None and admitted.reservation.tokens == 0

    await overrides.set_limits(db_sessions, ADMIN, user.id, 50, None)
    async with transaction(db_sessions) as session:
        await counter.add(session, [{"user": user.id, "day": today(), "delta": 60}])
    async with db_sessions() as session:
        turn = await prompts.next_turn(session, user.id, conversation.id)
        assert turn.quota_overrides == (50, None)
        with pytest.raises(QuotaExceededError):  # the override's limit, used up
            await unlimited.admit(user.id, 1, persist, session, turn.quota_overrides)
