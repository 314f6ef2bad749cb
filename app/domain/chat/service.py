"""What the web layer and the streaming core do with conversations and messages.

Every function takes the app's `async_sessionmaker` and runs one short transaction of its own: the
streaming core calls `save_progress` about once a second for every running reply, and must never
hold a session (or, on SQLite, the write lock) while it waits for tokens.

The life of a reply: `add_turn` stores the user's message and an empty assistant message in state
`streaming`, atomically; `save_progress` flushes the partial text; `finish_message` writes one final
state. Final states are never overwritten (the updates are conditional on `status = 'streaming'`),
so a late or duplicate finish, or a flush racing the finish, cannot corrupt a reply. At startup,
`mark_interrupted_at_startup` closes what a dead server left streaming. Regenerate is
`regeneration_prompt` (the history up to the question) then `replace_reply`, which sets the old
reply's `replaced_at` and adds the new `streaming` one in one transaction.

Functions that take a `user_id` are scoped to that owner: another user's ids behave as if they did
not exist (None / False), so the web layer can answer 404 without a separate permission check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from math import isfinite
from typing import Any
from uuid import UUID

from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import Select, case, delete, func, literal, select, update

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.models import (
    Conversation,
    ConversationSource,
    Message,
    MessageRole,
    MessageStatus,
)
from app.domain.errors import InvalidInputError

TITLE_MAX_CHARS = 200
DEFAULT_TITLE = "New chat"


class ConversationNotFoundError(LookupError):
    """No conversation with this id."""


class NotRegenerableError(Exception):
    """This reply cannot be answered again (the message says why, for the user)."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Timings:
    """When a reply was queued, produced its first token and ended, and how smooth it was."""

    queued_at: datetime | None = None
    first_token_at: datetime | None = None
    finished_at: datetime | None = None  # defaults to the time of the write
    ttft_ms: float | None = None
    gap_p50_ms: float | None = None
    gap_p99_ms: float | None = None

    @classmethod
    def from_epoch(
        cls,
        *,
        queued_at: float | None = None,
        first_token_at: float | None = None,
        finished_at: float | None = None,
        ttft_ms: float | None = None,
        gap_p50_ms: float | None = None,
        gap_p99_ms: float | None = None,
    ) -> Timings:
        """From `time.time()` seconds, as the engine's `Finished` event reports them."""
        return cls(
            queued_at=epoch_to_utc(queued_at),
            first_token_at=epoch_to_utc(first_token_at),
            finished_at=epoch_to_utc(finished_at),
            ttft_ms=ttft_ms,
            gap_p50_ms=gap_p50_ms,
            gap_p99_ms=gap_p99_ms,
        )


@dataclass(frozen=True, slots=True)
class CancelInfo:
    """Where Stop landed (token index) and how many tokens the engine produced after it."""

    token_index: int | None = None
    tokens_after_cancel: int | None = None


def epoch_to_utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def clean_title(title: str | None) -> str:
    """One line, at most TITLE_MAX_CHARS, never empty."""
    title = " ".join((title or "").split())
    return title[:TITLE_MAX_CHARS] or DEFAULT_TITLE


def _owned_conversation_ids(user_id: UUID) -> Select[Any]:
    return select(Conversation.id).where(Conversation.user_id == user_id)


def _update_message(message_id: UUID) -> Any:
    """An UPDATE of one message that only applies while it is still streaming."""
    return (
        update(Message)
        .where(Message.id == message_id, Message.status == MessageStatus.STREAMING)
        .execution_options(synchronize_session=False)
    )


def _keep_first(value: datetime) -> Any:
    """first_token_at is set once: later writes keep the earliest value already stored."""
    return func.coalesce(Message.first_token_at, literal(value, DateTimeUTC()))


# --- conversations ------------------------------------------------------------------------------


async def create_conversation(
    sessions: Sessions,
    user_id: UUID,
    title: str | None,
    source: ConversationSource | str = ConversationSource.PAGE,
) -> Conversation:
    async with transaction(sessions) as session:
        conversation = Conversation(
            user_id=user_id, title=clean_title(title), source=ConversationSource(source)
        )
        session.add(conversation)
    return conversation


async def list_conversations(
    sessions: Sessions,
    user_id: UUID,
    *,
    source: ConversationSource | str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Conversation]:
    """The user's conversations, most recently active first."""
    query = select(Conversation).where(Conversation.user_id == user_id)
    if source is not None:
        query = query.where(Conversation.source == ConversationSource(source))
    query = query.order_by(Conversation.updated_at.desc()).limit(limit).offset(offset)
    async with transaction(sessions) as session:
        return list(await session.scalars(query))


async def get_conversation(
    sessions: Sessions, user_id: UUID, conversation_id: UUID
) -> Conversation | None:
    async with transaction(sessions) as session:
        return await session.scalar(
            select(Conversation).where(
                Conversation.id == conversation_id, Conversation.user_id == user_id
            )
        )


async def rename_conversation(
    sessions: Sessions, user_id: UUID, conversation_id: UUID, title: str
) -> bool:
    async with transaction(sessions) as session:
        result = await session.execute(
            update(Conversation)
            .where(Conversation.id == conversation_id, Conversation.user_id == user_id)
            .values(title=clean_title(title), updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


async def delete_conversation(sessions: Sessions, user_id: UUID, conversation_id: UUID) -> bool:
    """Delete a conversation and (by ON DELETE CASCADE) its messages."""
    async with transaction(sessions) as session:
        result = await session.execute(
            delete(Conversation)
            .where(Conversation.id == conversation_id, Conversation.user_id == user_id)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


# --- messages -----------------------------------------------------------------------------------


def _new_reply(
    conversation_id: UUID,
    model: str | None,
    engine_request_id: str | None,
    replica_id: str | None,
    created_at: datetime,
) -> Message:
    """An empty assistant message, `streaming` until its reply ends."""
    return Message(
        conversation_id=conversation_id,
        role=MessageRole.ASSISTANT,
        content="",
        status=MessageStatus.STREAMING,
        model=model,
        engine_request_id=engine_request_id,
        replica_id=replica_id,
        completion_tokens=0,
        created_at=created_at,
    )


async def add_turn(
    sessions: Sessions,
    conversation_id: UUID,
    user_content: str,
    model: str | None,
    *,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
    title_if_untitled: str | None = None,
) -> tuple[Message, Message]:
    """Store the user's message and the (empty, `streaming`) assistant reply in one transaction.

    The reply is stamped one microsecond after the question so that ordering by `created_at` is
    total even on a coarse clock. Raises `ConversationNotFoundError`; ownership is the caller's
    business (it got the conversation from `get_conversation`).

    The transaction starts with a conditional UPDATE of the conversation, never a read: a DELETE
    racing it then either waits for this transaction (PostgreSQL's row lock; SQLite's write lock,
    taken by the first write) and removes the new rows with the conversation, or commits first and
    leaves nothing to update (ConversationNotFoundError). Reading first let the DELETE slip in
    between the read and the writes: the ORM's UPDATE then matched no row (StaleDataError, a 500).
    """
    now = utcnow()
    title = Conversation.title
    if title_if_untitled:  # a new chat names itself
        title = case(
            (Conversation.title == DEFAULT_TITLE, clean_title(title_if_untitled)),
            else_=Conversation.title,
        )
    async with transaction(sessions) as session:
        touched = await session.execute(
            update(Conversation)
            .where(Conversation.id == conversation_id)
            .values(updated_at=now, title=title)
            .execution_options(synchronize_session=False)
        )
        if touched.rowcount == 0:
            raise ConversationNotFoundError(conversation_id)
        user_message = Message(
            conversation_id=conversation_id,
            role=MessageRole.USER,
            content=user_content,
            status=MessageStatus.COMPLETED,
            created_at=now,
        )
        assistant_message = _new_reply(
            conversation_id, model, engine_request_id, replica_id, now + timedelta(microseconds=1)
        )
        session.add_all([user_message, assistant_message])
    return user_message, assistant_message


def progress_update(
    message_id: UUID, content: str, completion_tokens: int, first_token_at: datetime | None = None
) -> Any:
    """The UPDATE that flushes a streaming reply's text so far (a no-op once it is final)."""
    values: dict[str, Any] = {"content": content, "completion_tokens": completion_tokens}
    if first_token_at is not None:
        values["first_token_at"] = _keep_first(first_token_at)
    return _update_message(message_id).values(**values)


async def save_progress(
    sessions: Sessions,
    message_id: UUID,
    content: str,
    completion_tokens: int,
    first_token_at: datetime | None = None,
) -> bool:
    """Flush a streaming reply's text so far. False (and no write) once the reply is final."""
    async with transaction(sessions) as session:
        result = await session.execute(
            progress_update(message_id, content, completion_tokens, first_token_at)
        )
        return result.rowcount > 0


async def finish_message(
    sessions: Sessions, message_id: UUID, status: MessageStatus | str, **fields: Any
) -> bool:
    """Write a reply's final state; True if this call did it, False if it was already final.

    `fields` are `finish_update`'s; `content=None` keeps the last flushed text.
    """
    async with transaction(sessions) as session:
        result = await session.execute(finish_update(message_id, status, **fields))
        return result.rowcount > 0


def finish_update(
    message_id: UUID,
    status: MessageStatus | str,
    *,
    content: str | None = None,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    timings: Timings | None = None,
    error: str | None = None,
    cancel: CancelInfo | None = None,
    engine_request_id: str | None = None,
) -> Any:
    """The UPDATE that writes a reply's final state (see `finish_message`), to batch several."""
    status = MessageStatus(status)
    if not status.is_final:
        raise ValueError(f"{status} is not a final status")
    timings = timings or Timings()
    values: dict[str, Any] = {
        "status": status,
        "finish_reason": finish_reason,
        "error": error,
        "finished_at": timings.finished_at or utcnow(),
    }
    optional: Mapping[str, Any] = {
        "content": content,
        "engine_request_id": engine_request_id,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
        "queued_at": timings.queued_at,
        "ttft_ms": timings.ttft_ms,
        "gap_p50_ms": timings.gap_p50_ms,
        "gap_p99_ms": timings.gap_p99_ms,
        "cancel_token_index": cancel.token_index if cancel else None,
        "tokens_after_cancel": cancel.tokens_after_cancel if cancel else None,
    }
    values.update({name: value for name, value in optional.items() if value is not None})
    if timings.first_token_at is not None:
        values["first_token_at"] = _keep_first(timings.first_token_at)
    return _update_message(message_id).values(**values)


async def mark_interrupted_at_startup(sessions: Sessions, replica_id: str | None = None) -> int:
    """Close every reply this replica left `streaming` when it died; returns how many.

    Call it once at startup, before serving. With `replica_id`, only that replica's rows (and rows
    with no replica recorded) are closed, so restarting one replica leaves its siblings' live
    replies alone; without it, every streaming row is closed (a single-process deployment).
    `finished_at` stays empty: when the reply really stopped is unknown.
    """
    condition = Message.status == MessageStatus.STREAMING
    if replica_id is not None:
        condition = condition & ((Message.replica_id == replica_id) | Message.replica_id.is_(None))
    async with transaction(sessions) as session:
        result = await session.execute(
            update(Message)
            .where(condition)
            .values(
                status=MessageStatus.INTERRUPTED,
                finish_reason="interrupted",
                error="the server stopped before this reply finished",
            )
            .execution_options(synchronize_session=False)
        )
        return result.rowcount


async def record_client_ttft(
    sessions: Sessions, user_id: UUID, message_id: UUID, client_ttft_ms: float
) -> bool:
    """Store the time to first token a browser measured for one of its user's replies."""
    if not isfinite(client_ttft_ms) or client_ttft_ms < 0:
        raise InvalidInputError("client_ttft_ms must be a finite, non-negative number")
    async with transaction(sessions) as session:
        result = await session.execute(
            update(Message)
            .where(
                Message.id == message_id,
                Message.role == MessageRole.ASSISTANT,
                Message.conversation_id.in_(_owned_conversation_ids(user_id)),
            )
            .values(client_ttft_ms=client_ttft_ms)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


async def get_message(sessions: Sessions, user_id: UUID, message_id: UUID) -> Message | None:
    async with transaction(sessions) as session:
        return await session.scalar(
            select(Message).where(
                Message.id == message_id,
                Message.conversation_id.in_(_owned_conversation_ids(user_id)),
            )
        )


async def get_conversation_unscoped(
    sessions: Sessions, conversation_id: UUID
) -> Conversation | None:
    """A conversation by id for internal use (the caller already checked who may see it)."""
    async with transaction(sessions) as session:
        return await session.get(Conversation, conversation_id)


async def get_message_unscoped(sessions: Sessions, message_id: UUID) -> Message | None:
    """A message by id for internal use (the caller already checked who may see it)."""
    async with transaction(sessions) as session:
        return await session.get(Message, message_id)


async def list_messages(
    sessions: Sessions, user_id: UUID, conversation_id: UUID
) -> list[Message] | None:
    """The conversation's messages in order (regenerated replies left out), or None when it is not
    the user's (or not there)."""
    async with transaction(sessions) as session:
        owned = await session.scalar(
            select(Conversation.id).where(
                Conversation.id == conversation_id, Conversation.user_id == user_id
            )
        )
        if owned is None:
            return None
        return list(
            await session.scalars(
                select(Message)
                .where(Message.conversation_id == conversation_id, Message.replaced_at.is_(None))
                .order_by(Message.created_at)
            )
        )


def _prompt_rows(conversation_id: UUID) -> Select[Any]:
    """The messages a prompt is built from: not streaming, not replaced by a regeneration."""
    return (
        select(Message.role, Message.content)
        .where(
            Message.conversation_id == conversation_id,
            Message.status != MessageStatus.STREAMING,
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


async def conversation_history(sessions: Sessions, conversation_id: UUID) -> list[dict[str, str]]:
    """The conversation as chat messages for the prompt, oldest first."""
    async with transaction(sessions) as session:
        return _as_chat(await session.execute(_prompt_rows(conversation_id)))


def _later_message(reply: Message) -> Select[Any]:
    """Any message of the conversation after `reply` that is still part of the chat."""
    return select(Message.id).where(
        Message.conversation_id == reply.conversation_id,
        Message.created_at > reply.created_at,
        Message.replaced_at.is_(None),
    )


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
        if await session.scalar(_later_message(reply).limit(1)) is not None:
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


async def replace_reply(
    sessions: Sessions,
    reply: Message,
    model: str | None,
    *,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
) -> Message:
    """Mark `reply` replaced and add its `streaming` successor, in one transaction.

    The conditional UPDATE makes two regenerations of the same reply race safely: the second
    finds it already replaced (or a newer turn in the way) and raises NotRegenerableError.

    It starts by updating the conversation, as `add_turn` does, and for the same reason: a racing
    DELETE locks the conversation, then (cascading) its messages; taking the reply's lock first
    and the conversation's second (the successor's foreign key) deadlocked with it on PostgreSQL.
    Now the DELETE waits for this transaction or wins outright (ConversationNotFoundError).
    """
    now = utcnow()
    async with transaction(sessions) as session:
        touched = await session.execute(
            update(Conversation)
            .where(Conversation.id == reply.conversation_id)
            .values(updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if touched.rowcount == 0:
            raise ConversationNotFoundError(reply.conversation_id)
        if await session.scalar(_later_message(reply).limit(1)) is not None:
            raise NotRegenerableError("only the latest reply can be regenerated")
        replaced = await session.execute(
            update(Message)
            .where(
                Message.id == reply.id,
                Message.replaced_at.is_(None),
                Message.status != MessageStatus.STREAMING,
            )
            .values(replaced_at=now)
            .execution_options(synchronize_session=False)
        )
        if replaced.rowcount != 1:
            raise NotRegenerableError("this reply was already regenerated")
        successor = _new_reply(reply.conversation_id, model, engine_request_id, replica_id, now)
        session.add(successor)
    return successor
