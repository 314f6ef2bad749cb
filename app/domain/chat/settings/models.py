"""The stored chat settings: one conversation's, and a user's defaults for their new conversations.

Both hold the same two things: a system prompt, and the sampling settings given (a JSON object of
`ReplyOptions` fields; a field left out takes the model's default, app/domain/chat/replies/limits.py).
JSON keeps the set of sampling fields the protocol's business (app/domain/chat/schemas.py), not
the schema's: a new field needs no migration.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import JSON, ForeignKey, Text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, utcnow


class _ChosenSettings:
    system_prompt: Mapped[str] = mapped_column(Text, default="")
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ConversationSettings(_ChosenSettings, Base):
    """A conversation's settings, used for every turn of it (send and regenerate)."""

    __tablename__ = "conversation_settings"

    conversation_id: Mapped[UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )


class UserChatDefaults(_ChosenSettings, Base):
    """What a user's new page conversations start from."""

    __tablename__ = "user_chat_defaults"

    user_id: Mapped[UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )


async def start_from_defaults(session: AsyncSession, conversation_id: UUID, user_id: UUID) -> None:
    """Give a new conversation a copy of its owner's defaults, in the caller's transaction (after
    the conversation's row has been added)."""
    defaults = await session.get(UserChatDefaults, user_id)
    if defaults is None:
        return
    await session.flush()  # the conversation's row first, for the foreign key
    session.add(
        ConversationSettings(
            conversation_id=conversation_id,
            system_prompt=defaults.system_prompt,
            sampling=dict(defaults.sampling),
        )
    )
