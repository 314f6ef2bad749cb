"""What the model is shown: a conversation's history as chat messages, for a new turn or to answer
a reply's question again."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Select, select

from app.db.session import Sessions, transaction
from app.domain.chat.models import Conversation, ConversationSource, Message, MessageRole
from app.domain.chat.reply_rows import NotRegenerableError, later_message
from app.streaming.events import Status


def _prompt_rows(conversation_id: UUID) -> Select[Any]:
    """The messages a prompt is built from: not streaming, not replaced by a regeneration."""
    return (
        select(Message.role, Message.content)
        .where(
            Message.conversation_id == conversation_id,
            Message.status != Status.STREAMING,
            Message.replaced_at.is_(None),
        )
        .order_by(Message.created_at)
    )


def _as_chat(rows: Any) -> list[dict[str, str]]:
    """Rows as chat messages; replies that ended with no text at all are left out (a cut-short
    reply keeps the part the user saw)."""
    return [
        {"role": str(role), "content": content}
        for role, content in rows
        if content or role is not MessageRole.ASSISTANT
    ]


def with_system_prompt(system_prompt: str, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation's system prompt first (from its settings: chat_settings.py), if it has one."""
    if not system_prompt.strip():
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


async def conversation_history(sessions: Sessions, conversation_id: UUID) -> list[dict[str, str]]:
    """The conversation as chat messages for the prompt, oldest first."""
    async with transaction(sessions) as session:
        return _as_chat(await session.execute(_prompt_rows(conversation_id)))


async def regeneration_prompt(
    sessions: Sessions, reply: Message
) -> tuple[list[dict[str, str]], UUID]:
    """The chat messages `reply` answered, to answer them again, and the question's id.

    Only the latest reply of a page conversation, once it has ended, can be regenerated: an
    earlier one has later turns built on it, and an API conversation's prompt was the client's
    own message list, not what is stored. Raises NotRegenerableError saying which.
    """
    async with transaction(sessions) as session:
        conversation = await session.get(Conversation, reply.conversation_id)
        if conversation is None or conversation.source is not ConversationSource.PAGE:
            raise NotRegenerableError("only replies in the chat page can be regenerated")
        if reply.replaced_at is not None:
            raise NotRegenerableError("this reply was already regenerated")
        if not reply.is_final:
            raise NotRegenerableError("this reply is still streaming: stop it first")
        if await session.scalar(later_message(reply).limit(1)) is not None:
            raise NotRegenerableError("only the latest reply can be regenerated")
        history = _as_chat(
            await session.execute(
                _prompt_rows(reply.conversation_id).where(Message.created_at < reply.created_at)
            )
        )
        question_id = await session.scalar(
            select(Message.id)
            .where(
                Message.conversation_id == reply.conversation_id,
                Message.role == MessageRole.USER,
                Message.created_at < reply.created_at,
            )
            .order_by(Message.created_at.desc())
            .limit(1)
        )
    if question_id is None or not history or history[-1]["role"] != MessageRole.USER:
        raise NotRegenerableError("there is no question before this reply to answer again")
    return history, question_id
