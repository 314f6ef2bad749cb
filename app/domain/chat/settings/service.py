"""Per-conversation settings and each user's defaults: read, checked, saved, and applied to a turn.

A page conversation starts with a copy of its owner's defaults (settings_models.py
`start_from_defaults`, in the transaction that creates it), so changing the defaults later leaves existing conversations as
they are. Every turn of a conversation (send and regenerate, on every transport) uses its settings:
the request's own sampling fields first, then the conversation's, then the model's defaults
(`ReplyLimits.sampling`); its system prompt goes first in the prompt (app/domain/chat/prompts/turns.py).
Settings are checked as a request's sampling fields are, by the same `ReplyLimits`.
"""

from __future__ import annotations

from uuid import UUID

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.db.upsert import upsert
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation
from app.domain.chat.replies.limits import MODEL_DEFAULTS, ReplyLimits, overlay
from app.domain.chat.schemas import ReplyOptions
from app.domain.chat.settings.models import ConversationSettings, UserChatDefaults
from app.domain.chat.settings.schemas import ChatSettings, SettingsView
from app.domain.errors import InvalidInputError

SettingsRow = ConversationSettings | UserChatDefaults

NO_SETTINGS = ChatSettings()


def as_settings(row: ConversationSettings | UserChatDefaults | None) -> ChatSettings:
    if row is None:
        return NO_SETTINGS
    return msgspec.convert({**row.sampling, "system_prompt": row.system_prompt}, ChatSettings)


def view(settings: ChatSettings, limits: ReplyLimits) -> SettingsView:
    defaults = msgspec.structs.replace(MODEL_DEFAULTS, max_tokens=limits.default_max_tokens)
    return SettingsView(settings=settings, model_defaults=defaults)


def checked(settings: ChatSettings, limits: ReplyLimits, context_size: int) -> ChatSettings:
    """The settings, if every turn could use them; raises InvalidInputError like a request would."""
    if len(settings.system_prompt) > limits.max_message_chars:
        raise InvalidInputError(
            f"the system prompt is {len(settings.system_prompt)} characters; the limit is "
            f"{limits.max_message_chars}",
            field="system_prompt",
        )
    limits.sampling(settings.options(), context_size)  # raises on a value out of range
    return settings


async def _store(
    session: AsyncSession, model: type[SettingsRow], key: dict[str, UUID], settings: ChatSettings
) -> None:
    """Write `settings` into the row of `model` with this key, created if there is none: one
    statement, so that saves racing each other each land and the last one wins."""
    values = {
        "system_prompt": settings.system_prompt,
        "sampling": settings.given(),
        "updated_at": utcnow(),
    }
    await session.execute(upsert(session, model, key, values))


async def for_conversation(sessions: Sessions, conversation_id: UUID) -> ChatSettings:
    """A conversation's settings (none chosen: all defaults)."""
    async with transaction(sessions) as session:
        return as_settings(await session.get(ConversationSettings, conversation_id))


async def for_users_conversation(
    sessions: Sessions, user_id: UUID, conversation_id: UUID
) -> ChatSettings:
    """The settings of a conversation of `user_id`'s; another user's answers not found."""
    if await conversations.get_conversation(sessions, user_id, conversation_id) is None:
        raise conversations.ConversationNotFoundError(conversation_id)
    return await for_conversation(sessions, conversation_id)


async def save_for_conversation(
    sessions: Sessions, user_id: UUID, conversation_id: UUID, settings: ChatSettings
) -> ChatSettings:
    async with transaction(sessions) as session:
        owner = await session.scalar(
            select(Conversation.user_id).where(Conversation.id == conversation_id)
        )
        if owner != user_id:
            raise conversations.ConversationNotFoundError(conversation_id)
        await _store(session, ConversationSettings, {"conversation_id": conversation_id}, settings)
    return settings


async def user_defaults(sessions: Sessions, user_id: UUID) -> ChatSettings:
    async with transaction(sessions) as session:
        return as_settings(await session.get(UserChatDefaults, user_id))


async def save_user_defaults(
    sessions: Sessions, user_id: UUID, settings: ChatSettings
) -> ChatSettings:
    async with transaction(sessions) as session:
        await _store(session, UserChatDefaults, {"user_id": user_id}, settings)
    return settings


def turn_options(request: ReplyOptions, settings: ChatSettings) -> ReplyOptions:
    """A turn's sampling settings: the request's own, then the conversation's."""
    return overlay(request, settings.options())
