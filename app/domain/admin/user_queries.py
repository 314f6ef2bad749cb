"""The users page's list: each account with its role, state, last seen, and its replies and
tokens this day and this month (UTC), counted from the replies' own engine usage, and what its
token quotas' counter holds (app/domain/quotas/: replies still running count their reservation;
deleted conversations still count)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts.models import ApiKey, User, UserState
from app.domain.chat.models import Conversation, Message, MessageRole
from app.domain.quotas import counter


@dataclass(frozen=True, slots=True)
class Usage:
    replies_day: int = 0
    tokens_day: int = 0
    replies_month: int = 0
    tokens_month: int = 0


@dataclass(frozen=True, slots=True)
class UserRow:
    user: User
    last_seen_at: datetime | None  # in the app, or with an API key
    usage: Usage
    quota_used: tuple[int, int] = (0, 0)  # the quota counter's tokens today, this month


async def list_users(
    sessions: Sessions,
    *,
    search: str | None = None,
    state: UserState | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[UserRow], int]:
    """One page of users (pending first, then by sign-up), and how many match in all."""
    query = select(User)
    if search:
        query = query.where(func.lower(User.email).like(f"%{search.lower()}%"))
    if state is not None:
        query = query.where(User.state == state)
    async with transaction(sessions) as session:
        total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
        pending_first = case((User.state == UserState.PENDING, 0), else_=1)
        users = list(
            await session.scalars(
                query.order_by(pending_first, User.created_at, User.id).limit(limit).offset(offset)
            )
        )
        ids = [u.id for u in users]
        usage = await _usage(session, ids)
        today = utcnow().date()
        quota_used = await counter.usage_by_user(session, ids, today, today.replace(day=1))
        key_seen = dict(
            (
                await session.execute(
                    select(ApiKey.user_id, func.max(ApiKey.last_used_at))
                    .where(ApiKey.user_id.in_(ids))
                    .group_by(ApiKey.user_id)
                )
            ).all()
        )
    rows = [
        UserRow(
            u,
            _latest(u.last_seen_at, key_seen.get(u.id)),
            usage.get(u.id, Usage()),
            quota_used.get(u.id, (0, 0)),
        )
        for u in users
    ]
    return rows, total


def _latest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


async def _usage(session: AsyncSession, user_ids: list[UUID]) -> dict[UUID, Usage]:
    if not user_ids:
        return {}
    now = utcnow()
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    tokens = func.coalesce(Message.prompt_tokens, 0) + func.coalesce(Message.completion_tokens, 0)
    today = Message.created_at >= day
    rows = await session.execute(
        select(
            Conversation.user_id,
            func.count(Message.id),
            func.coalesce(func.sum(tokens), 0),
            func.coalesce(func.sum(case((today, 1), else_=0)), 0),
            func.coalesce(func.sum(case((today, tokens), else_=0)), 0),
        )
        .join(Conversation, Conversation.id == Message.conversation_id)
        .where(
            Conversation.user_id.in_(user_ids),
            Message.role == MessageRole.ASSISTANT,
            Message.created_at >= month,
        )
        .group_by(Conversation.user_id)
    )
    return {
        user_id: Usage(int(r_day), int(t_day), int(r_month), int(t_month))
        for user_id, r_month, t_month, r_day, t_day in rows.all()
    }


__all__ = ["Usage", "UserRow", "list_users"]
