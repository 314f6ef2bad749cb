"""The token counter's SQL: the one read a check needs, the conditional reservation, and the
settling upsert that the final save of each reply runs in its own transaction.

Why a reservation cannot overshoot under concurrent replies: `RESERVE` adds a reply's most
tokens to today's row only while that row (and the month's sum with it) is still under the
limit, in one conditional UPDATE. On PostgreSQL concurrent reservations of one user queue on
that row's lock and each re-checks the condition on the row as the one before left it (the
month's earlier days change only by settling, which only lowers them); on SQLite the database's
one write lock serialises them. So the last reply admitted saw the counter under the limit, and
every reply settles to no more than it reserved: the total ends under the limit plus that one
reply's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any
from uuid import UUID

from sqlalchemy import BigInteger, Date, and_, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.models import User
from app.domain.quotas.models import QuotaUsage

_USAGE = QuotaUsage.__table__
_USERS = User.__table__


@dataclass(frozen=True, slots=True)
class UsageRow:
    """A user's overrides (None: the default) and their tokens today and this month so far."""

    per_day: int | None
    per_month: int | None
    used_day: int
    used_month: int


def _tokens_between(user_id: UUID, first: date, last: date) -> Any:
    return (
        select(func.coalesce(func.sum(_USAGE.c.tokens), 0))
        .where(_USAGE.c.user_id == user_id, _USAGE.c.day >= first, _USAGE.c.day <= last)
        .scalar_subquery()
    )


async def read_usage(
    session: AsyncSession, user_id: UUID, today: date, month_start: date
) -> UsageRow | None:
    """One query: the user's overrides and use (None: no such user)."""
    row = (
        await session.execute(
            select(
                _USERS.c.quota_tokens_per_day,
                _USERS.c.quota_tokens_per_month,
                _tokens_between(user_id, today, today),
                _tokens_between(user_id, month_start, today),
            ).where(_USERS.c.id == user_id)
        )
    ).first()
    if row is None:
        return None
    return UsageRow(row[0], row[1], int(row[2]), int(row[3]))


async def usage_by_user(
    session: AsyncSession, user_ids: list[UUID], today: date, month_start: date
) -> dict[UUID, tuple[int, int]]:
    """Tokens used today and this month by each of `user_ids` (the users page's list)."""
    if not user_ids:
        return {}
    this_day = func.sum(func.coalesce(_USAGE.c.tokens, 0)).filter(_USAGE.c.day == today)
    rows = await session.execute(
        select(_USAGE.c.user_id, func.coalesce(this_day, 0), func.sum(_USAGE.c.tokens))
        .where(_USAGE.c.user_id.in_(user_ids), _USAGE.c.day >= month_start)
        .group_by(_USAGE.c.user_id)
    )
    return {user_id: (int(day), int(month)) for user_id, day, month in rows.all()}


_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def _insert(session: AsyncSession) -> Any:
    return _INSERTS[session.get_bind().dialect.name](_USAGE)


async def reserve(
    session: AsyncSession,
    user_id: UUID,
    today: date,
    month_start: date,
    tokens: int,
    *,
    per_day: int,
    per_month: int,
) -> bool:
    """Add `tokens` to the user's row of today if, and only if, the day's and the month's use
    are still under their limits (0: none); True if added. Call it in a transaction of its own:
    its first statement is a write, so on SQLite the write lock is taken before anything is read."""
    await session.execute(
        _insert(session)
        .values(user_id=user_id, day=today, tokens=0)
        .on_conflict_do_nothing(index_elements=["user_id", "day"])
    )
    conditions = [_USAGE.c.user_id == user_id, _USAGE.c.day == today]
    if per_day > 0:
        conditions.append(_USAGE.c.tokens < per_day)
    if per_month > 0:
        # the month's earlier days (an alias: the subquery reads other rows than the one updated)
        earlier_alias = _USAGE.alias("earlier")
        earlier = select(func.coalesce(func.sum(earlier_alias.c.tokens), 0)).where(
            earlier_alias.c.user_id == user_id,
            earlier_alias.c.day >= month_start,
            earlier_alias.c.day < today,
        )
        conditions.append(_USAGE.c.tokens + earlier.scalar_subquery() < per_month)
    result = await session.execute(
        _USAGE.update().where(and_(*conditions)).values(tokens=_USAGE.c.tokens + tokens)
    )
    return result.rowcount == 1


def settle_statement(dialect: str) -> Any:
    """Add `delta` (`user`, `day`) to a counter row, made if missing: one executemany for a batch
    of replies' ends. Made from the user's row, so a user deleted meanwhile adds nothing (and
    does not fail the batch of final saves it rides in on a missing foreign key)."""
    source = select(
        _USERS.c.id,
        bindparam("day", type_=Date),
        bindparam("delta", type_=BigInteger),
    ).where(_USERS.c.id == bindparam("user", type_=_USERS.c.id.type))
    insert = _INSERTS[dialect](_USAGE).from_select(["user_id", "day", "tokens"], source)
    return insert.on_conflict_do_update(
        index_elements=["user_id", "day"],
        set_={"tokens": _USAGE.c.tokens + insert.excluded.tokens},
    )


async def add(session: AsyncSession, params: list[dict[str, Any]]) -> None:
    """Run `settle_statement` for `params` ({"user", "day", "delta"} each) in `session`."""
    if params:
        await session.execute(settle_statement(session.get_bind().dialect.name), params)
