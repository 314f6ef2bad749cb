"""Ratings of assistant replies: a thumbs up or down and an optional comment, one per reply and
user, set (and changed) in place, or removed.

Scoped like every chat query: a user can rate only replies in their own conversations; any other
message id behaves as missing (NotFoundError, a 404).
"""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import delete, select

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.db.upsert import upsert
from app.domain.chat.conversations.store import owned_conversation_ids
from app.domain.chat.models import Conversation, Message, MessageRole, Rating, ReplyRating
from app.domain.chat.replies.service import NotFoundError

MAX_COMMENT_CHARS = 2000


async def rate_reply(
    sessions: Sessions, user_id: UUID, message_id: UUID, rating: Rating, comment: str | None
) -> ReplyRating:
    """Set the user's rating of one of their replies (replacing any earlier one)."""
    comment = (comment or "").strip() or None
    async with transaction(sessions) as session:
        reply = await session.scalar(
            select(Message.id).where(
                Message.id == message_id,
                Message.role == MessageRole.ASSISTANT,
                Message.conversation_id.in_(owned_conversation_ids(user_id)),
            )
        )
        if reply is None:
            raise NotFoundError(message_id)
        # One statement, so that clicks racing each other (first ratings included) each land:
        # the last one wins (app/db/upsert.py).
        values = {"rating": Rating(rating), "comment": comment, "updated_at": utcnow()}
        key = {"message_id": message_id, "user_id": user_id}
        return await session.scalar(
            upsert(session, ReplyRating, key, values)
            .returning(ReplyRating)
            .execution_options(populate_existing=True)
        )


async def remove_rating(sessions: Sessions, user_id: UUID, message_id: UUID) -> bool:
    """Take the user's rating back; False when there was none."""
    async with transaction(sessions) as session:
        result = await session.execute(
            delete(ReplyRating)
            .where(ReplyRating.message_id == message_id, ReplyRating.user_id == user_id)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


async def conversation_ratings(
    sessions: Sessions, user_id: UUID, conversation_id: UUID
) -> list[ReplyRating] | None:
    """The user's ratings of the replies in one of their conversations; None when it is not
    theirs (or not there)."""
    async with transaction(sessions) as session:
        owned = await session.scalar(
            owned_conversation_ids(user_id).where(Conversation.id == conversation_id)
        )
        if owned is None:
            return None
        return list(
            await session.scalars(
                select(ReplyRating)
                .join(Message, Message.id == ReplyRating.message_id)
                .where(ReplyRating.user_id == user_id, Message.conversation_id == conversation_id)
            )
        )


async def ratings_of_messages(sessions: Sessions, message_ids: list[UUID]) -> list[ReplyRating]:
    """Every user's ratings of these messages (the admin's conversation view; not scoped)."""
    if not message_ids:
        return []
    async with transaction(sessions) as session:
        return list(
            await session.scalars(
                select(ReplyRating).where(ReplyRating.message_id.in_(message_ids))
            )
        )
