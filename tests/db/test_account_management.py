"""What admins do to accounts, on real SQLite and PostgreSQL (app/domain/accounts/management.py,
links.py, audit.py): approve, disable, enable, roles, delete, one-time links, and the audit log;
the last active admin stays one when two admins act at the same moment."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts import audit, links, management
from app.domain.accounts import service as accounts
from app.domain.accounts.audit import Actor
from app.domain.accounts.models import AccountToken, ApiKey, AuditEntry, User, UserState
from app.domain.accounts.service import SignupClosedError

Sessions = async_sessionmaker[AsyncSession]
MakeUser = Callable[..., Awaitable[User]]
PASSWORD = "correct horse battery staple"
ROUNDS = 8  # each race is run this many times: a lost race shows up as two winners


def acting(user: User) -> Actor:
    return Actor(user.id, user.email, "192.0.2.1")


async def active_admins(sessions: Sessions) -> int:
    async with sessions() as session:
        query = select(func.count()).where(User.is_admin.is_(True), User.state == "active")
        return await session.scalar(query) or 0


async def entries(sessions: Sessions, action: str) -> list[AuditEntry]:
    async with sessions() as session:
        return list(await session.scalars(select(AuditEntry).where(AuditEntry.action == action)))


async def test_two_admins_demoting_each_other_leave_one_admin(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    for _ in range(ROUNDS):
        a = await make_user(is_admin=True)
        b = await make_user(is_admin=True)
        async with db_sessions() as session, session.begin():  # only a and b are admins
            await session.execute(
                update(User).where(User.id.not_in([a.id, b.id])).values(is_admin=False)
            )
        results = await asyncio.gather(
            management.set_role(db_sessions, acting(a), b.id, False),
            management.set_role(db_sessions, acting(b), a.id, False),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, management.LastAdminError)]
        assert len(refused) == 1, results
        assert await active_admins(db_sessions) == 1


@pytest.mark.parametrize("action", ["disable", "delete_user"])
async def test_two_admins_removing_each_other_leave_one_admin(
    db_sessions: Sessions, make_user: MakeUser, action: str
) -> None:
    change = getattr(management, action)
    for _ in range(ROUNDS):
        a = await make_user(is_admin=True)
        b = await make_user(is_admin=True)
        async with db_sessions() as session, session.begin():
            await session.execute(
                update(User).where(User.id.not_in([a.id, b.id])).values(is_admin=False)
            )
        results = await asyncio.gather(
            change(db_sessions, acting(a), b.id),
            change(db_sessions, acting(b), a.id),
            return_exceptions=True,
        )
        assert sum(isinstance(r, management.LastAdminError) for r in results) == 1, results
        assert await active_admins(db_sessions) == 1


async def test_the_last_admin_cannot_demote_disable_or_delete_themself(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    admin = await make_user(is_admin=True)
    for change in (management.disable, management.delete_user):
        with pytest.raises(management.LastAdminError):
            await change(db_sessions, acting(admin), admin.id)
    with pytest.raises(management.LastAdminError):
        await management.set_role(db_sessions, acting(admin), admin.id, False)
    assert await active_admins(db_sessions) == 1
    other = await make_user(is_admin=True)  # with a second admin, it may
    await management.set_role(db_sessions, acting(other), admin.id, False)
    assert await active_admins(db_sessions) == 1


async def test_two_approvals_of_one_account_approve_it_once(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    admin = await make_user(is_admin=True)
    for _ in range(ROUNDS):
        pending = await accounts.create_user(
            db_sessions, f"p-{_}@example.com", PASSWORD, is_admin=False, state=UserState.PENDING
        )
        results = await asyncio.gather(
            management.approve(db_sessions, acting(admin), pending.id),
            management.approve(db_sessions, acting(admin), pending.id),
            return_exceptions=True,
        )
        assert sum(isinstance(r, management.WrongStateError) for r in results) == 1, results
    assert len(await entries(db_sessions, "approve")) == ROUNDS


async def test_disabling_revokes_keys_and_ends_sessions_and_the_audit_outlives_a_delete(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    admin = await make_user(is_admin=True)
    user = await make_user()
    _, secret = await accounts.create_api_key(db_sessions, user.id, "k")
    assert await accounts.verify_api_key(db_sessions, secret) is not None
    disabled = await management.disable(db_sessions, acting(admin), user.id)
    assert disabled.state == UserState.DISABLED and disabled.session_epoch == user.session_epoch + 1
    assert await accounts.verify_api_key(db_sessions, secret) is None
    with pytest.raises(management.WrongStateError):
        await management.disable(db_sessions, acting(admin), user.id)
    enabled = await management.enable(db_sessions, acting(admin), user.id)
    assert enabled.state == UserState.ACTIVE
    assert await accounts.verify_api_key(db_sessions, secret) is None  # revoked for good

    await management.delete_user(db_sessions, acting(admin), user.id)
    assert await accounts.get_user(db_sessions, user.id) is None
    async with db_sessions() as session:
        assert await session.scalar(select(func.count()).where(ApiKey.user_id == user.id)) == 0
    logged, _ = await audit.list_entries(db_sessions, audit.AuditFilter(user=str(user.id)), limit=9)
    assert [e.action for e in logged] == ["delete", "enable", "disable"]
    assert all(e.actor_id == admin.id and e.address == "192.0.2.1" for e in logged)
    with pytest.raises(management.UserNotFoundError):
        await management.enable(db_sessions, acting(admin), user.id)


async def test_a_pending_accounts_keys_do_not_work(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    await make_user(is_admin=True)
    pending = await accounts.create_user(
        db_sessions, "wait@example.com", PASSWORD, state=UserState.PENDING
    )
    _, secret = await accounts.create_api_key(db_sessions, pending.id, "k")
    assert await accounts.verify_api_key(db_sessions, secret) is None


async def test_an_invitation_signs_up_one_account_for_its_email(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    admin = await make_user(is_admin=True)
    _, secret = await links.create_invite(db_sessions, acting(admin), "Invited@Example.com")
    with pytest.raises(links.InvalidLinkError):  # another email
        await accounts.create_user(db_sessions, "other@example.com", PASSWORD, invite=secret)
    with pytest.raises(links.InvalidLinkError):
        await accounts.create_user(db_sessions, "x@example.com", PASSWORD, invite="made-up")
    user = await accounts.create_user(db_sessions, "invited@example.com", PASSWORD, invite=secret)
    assert user.state == UserState.ACTIVE and not user.is_admin
    with pytest.raises(links.InvalidLinkError):  # single use
        await accounts.create_user(db_sessions, "invited2@example.com", PASSWORD, invite=secret)

    _, racing = await links.create_invite(db_sessions, acting(admin))
    results = await asyncio.gather(
        *(
            accounts.create_user(db_sessions, f"race{i}@example.com", PASSWORD, invite=racing)
            for i in range(3)
        ),
        return_exceptions=True,
    )
    assert sum(isinstance(r, User) for r in results) == 1, results

    _, expired = await links.create_invite(db_sessions, acting(admin), ttl=timedelta(seconds=-1))
    with pytest.raises(links.InvalidLinkError):
        await accounts.create_user(db_sessions, "late@example.com", PASSWORD, invite=expired)
    async with db_sessions() as session:  # only hashes are stored
        stored = list(await session.scalars(select(AccountToken.token_hash)))
    assert secret not in stored and racing not in stored


async def test_closed_sign_up_admits_only_the_first_account(db_sessions: Sessions) -> None:
    first = await accounts.create_user(db_sessions, "first@example.com", PASSWORD, only_first=True)
    assert first.is_admin and first.state == UserState.ACTIVE
    with pytest.raises(SignupClosedError):
        await accounts.create_user(db_sessions, "second@example.com", PASSWORD, only_first=True)


async def test_a_reset_link_sets_the_password_once(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    admin = await make_user(is_admin=True)
    user = await make_user()
    _, key = await accounts.create_api_key(db_sessions, user.id, "k")
    _, old = await links.create_reset_link(db_sessions, acting(admin), user.id)
    _, secret = await links.create_reset_link(db_sessions, acting(admin), user.id)
    with pytest.raises(links.InvalidLinkError):  # a newer link replaced it
        await links.reset_password(db_sessions, old, "a brand new passphrase")
    reset = await links.reset_password(db_sessions, secret, "a brand new passphrase")
    assert reset.session_epoch == user.session_epoch + 1
    assert await accounts.authenticate(db_sessions, user.email, "a brand new passphrase")
    assert await accounts.verify_api_key(db_sessions, key) is None
    with pytest.raises(links.InvalidLinkError):
        await links.reset_password(db_sessions, secret, "yet another passphrase")
    assert [e.action for e in await entries(db_sessions, "reset_link")] == ["reset_link"] * 2
