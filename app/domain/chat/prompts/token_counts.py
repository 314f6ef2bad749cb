"""Storing the token counts the fitting made (app/domain/chat/prompts/window.py): each message is
counted once, by the engine, and its count kept; rows written before counts were kept get theirs
at their next use."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.chat.models import Message

_MESSAGES = Message.__table__
_STORE_COUNT = (
    update(_MESSAGES)
    .where(_MESSAGES.c.id == bindparam("counted_id"))
    .values(token_count=bindparam("tokens"))
)


async def store_counts(session: AsyncSession, counted: dict[UUID, int]) -> None:
    """Keep `counted` (message id: tokens) in the caller's transaction: one executemany."""
    if counted:
        rows = [{"counted_id": id_, "tokens": tokens} for id_, tokens in counted.items()]
        await session.execute(_STORE_COUNT, rows)
