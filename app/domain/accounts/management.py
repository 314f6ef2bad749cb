"""What an admin does to accounts: approve, disable, enable, change the role, delete, end every
session. Each is one transaction holding the change and its audit entry (app/domain/accounts/audit.py).

The last active admin never loses the role, nor is disabled or deleted, even when two admins act
at the same moment: the database decides, not a read before the write. Each change is a single
conditional statement, "... WHERE this is not the last active admin" (`_keeps_an_admin`):
- SQLite runs one writer at a time, and a transaction whose first statement writes takes the
  write lock before that statement reads anything, so the condition reads what is committed;
- PostgreSQL (READ COMMITTED) evaluates a statement's subquery on a snapshot taken when the
  statement starts, so two admins demoting each other would each still see the other: the
  transaction first locks every active admin's row (SELECT ... FOR UPDATE), and the second
  waits for the first to commit, then takes a fresh snapshot for its UPDATE.
"""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import ColumnElement, and_, delete, exists, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts import audit
from app.domain.accounts.audit import Actor
from app.domain.accounts.models import ApiKey, User, UserState
from app.domain.errors import DomainError


class UserNotFoundError(DomainError, LookupError):
    status = 404
    message = "no such user"


class LastAdminError(DomainError):
    status = 409
    message = "the last active admin must stay an active admin"


class WrongStateError(DomainError):
    """The account is not in the state the action starts from (approving an active account)."""

    status = 409


def _is_active_admin(row: type[User] = User) -> ColumnElement[bool]:
    return and_(row.is_admin.is_(True), row.state == UserState.ACTIVE)


def _keeps_an_admin(user_id: UUID) -> ColumnElement[bool]:
    """True unless the row `user_id` is the only active admin."""
    other = aliased(User)
    another = exists().where(_is_active_admin(other), other.id != user_id)  # type: ignore[arg-type]
    return or_(not_(_is_active_admin()), another)


async def _lock_admins(session: AsyncSession) -> None:
    """PostgreSQL: lock every active admin's row until this transaction ends (see the module's
    docstring). SQLite: nothing (its write lock serialises writers; a read here first would turn
    a concurrent commit into SQLITE_BUSY instead of a wait)."""
    connection = await session.connection()
    if connection.dialect.name == "postgresql":
        await session.execute(select(User.id).where(_is_active_admin()).with_for_update())


async def _refusal(session: AsyncSession, user_id: UUID, wrong_state: str) -> DomainError:
    """Why a conditional change matched no row: no such user, the last admin, or its state."""
    user = await session.get(User, user_id)
    if user is None:
        return UserNotFoundError()
    if user.is_admin and user.state == UserState.ACTIVE:
        return LastAdminError()
    return WrongStateError(wrong_state)


async def _change(
    sessions: Sessions,
    actor: Actor,
    user_id: UUID,
    action: str,
    *,
    when: ColumnElement[bool] | None = None,
    guard_admin: bool = False,
    wrong_state: str = "",
    revoke: bool = False,
    **values: object,
) -> User:
    """UPDATE the user's row when `when` holds (and, with `guard_admin`, when it is not the last
    active admin), and record `action`; raise why not otherwise."""
    conditions = [User.id == user_id]
    if when is not None:
        conditions.append(when)
    if guard_admin:
        conditions.append(_keeps_an_admin(user_id))
    async with transaction(sessions) as session:
        if guard_admin:
            await _lock_admins(session)
        user = await session.scalar(
            update(User).where(*conditions).values(**values).returning(User)
        )
        if user is None:
            raise await _refusal(session, user_id, wrong_state)
        if revoke:
            await revoke_keys(session, user_id)
        await audit.record(session, actor, action, user, **_detail(values))
        return user


def _detail(values: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in values.items() if k in {"is_admin", "state"}}


async def revoke_keys(session: AsyncSession, user_id: UUID) -> None:
    await session.execute(
        update(ApiKey)
        .where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )


def next_epoch() -> ColumnElement[int]:
    return User.session_epoch + 1


async def approve(sessions: Sessions, actor: Actor, user_id: UUID) -> User:
    """A pending account becomes active (once: a second approval finds it active, a 409)."""
    return await _change(
        sessions,
        actor,
        user_id,
        "approve",
        when=User.state == UserState.PENDING,
        wrong_state="the account is not waiting for approval",
        state=UserState.ACTIVE,
    )


async def disable(sessions: Sessions, actor: Actor, user_id: UUID) -> User:
    """Switch the account off: its sessions end and its API keys are revoked."""
    return await _change(
        sessions,
        actor,
        user_id,
        "disable",
        when=User.state != UserState.DISABLED,
        guard_admin=True,
        wrong_state="the account is disabled already",
        revoke=True,
        state=UserState.DISABLED,
        session_epoch=next_epoch(),
    )


async def enable(sessions: Sessions, actor: Actor, user_id: UUID) -> User:
    return await _change(
        sessions,
        actor,
        user_id,
        "enable",
        when=User.state == UserState.DISABLED,
        wrong_state="the account is not disabled",
        state=UserState.ACTIVE,
    )


async def set_role(sessions: Sessions, actor: Actor, user_id: UUID, is_admin: bool) -> User:
    return await _change(
        sessions,
        actor,
        user_id,
        "role",
        when=User.is_admin.is_(not is_admin),
        guard_admin=not is_admin,
        wrong_state=f"the user is {'an admin' if is_admin else 'not an admin'} already",
        is_admin=is_admin,
    )


async def end_sessions(sessions: Sessions, actor: Actor, user_id: UUID) -> User:
    """Log the user out everywhere: every session made before now is dropped on its next use."""
    return await _change(sessions, actor, user_id, "logout_everywhere", session_epoch=next_epoch())


async def delete_user(sessions: Sessions, actor: Actor, user_id: UUID) -> User:
    """Delete the account and everything of theirs (conversations, ratings, keys and links go by
    ON DELETE CASCADE); the audit log keeps its entries about them."""
    async with transaction(sessions) as session:
        await _lock_admins(session)
        user = await session.scalar(
            delete(User).where(User.id == user_id, _keeps_an_admin(user_id)).returning(User)
        )
        if user is None:
            raise await _refusal(session, user_id, "")
        await audit.record(session, actor, "delete", user)
        return user
