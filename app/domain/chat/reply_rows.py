"""The reply row's life, from `streaming` to its one final state, and its record of the reply.

A reply starts as an empty assistant message in state `streaming`, written with its question in
the send's own transaction (`write_turn`; a `/v1` call's: `write_api_call`); the ledger
(app/domain/chat/ledger.py) flushes the partial text with `PROGRESS_UPDATE` and writes the end
with `FINAL_UPDATE`. Final states are never overwritten (the
updates are conditional on `status = 'streaming'`), so a late or duplicate finish, or a flush
racing the finish, cannot corrupt a reply. At startup, `mark_interrupted_at_startup` closes what a
dead server left streaming. Regenerate and edit add versions next to the old ones
(app/domain/chat/branches.py).

The row keeps the streaming core's `Outcome` field for field: `outcome_columns` writes it and
`stored_outcome` reads it back, and they are the only places that spell its fields for the
database.

Every function that touches the database takes the app's `async_sessionmaker` and runs one short
transaction of its own: the streaming core must never hold a session (or, on SQLite, the write
lock) while it waits for tokens.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from math import isfinite
from typing import Any, NamedTuple
from uuid import UUID, uuid4

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.context_window import Fitted
from app.domain.chat.conversations import (
    DEFAULT_TITLE,
    ConversationNotFoundError,
    clean_title,
    distinct_title,
    owned_conversation_ids,
    title_from_message,
    titles_like,
)
from app.domain.chat.models import Conversation, ConversationSource, Message, MessageRole
from app.domain.chat.token_counts import store_counts
from app.domain.errors import DomainError, InvalidInputError
from app.streaming.events import Status
from app.streaming.generation import Outcome

API_TITLE_CHARS = 80
"""A `/v1` call's conversation is titled with the start of its question."""


class NotRegenerableError(DomainError):
    """This reply cannot be answered again (the message says why, for the user)."""

    status = 409


# --- the record: an Outcome as the row's columns, and back --------------------------------------


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def outcome_columns(outcome: Outcome) -> dict[str, Any]:
    """The message row's columns holding `outcome` (all of it but the row's id)."""
    return {
        "status": outcome.status,
        "finish_reason": outcome.finish_reason,
        "content": outcome.text,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "queued_at": _utc(outcome.queued_at),
        "first_token_at": _utc(outcome.first_token_at),
        "finished_at": _utc(outcome.finished_at),
        "ttft_ms": outcome.ttft_ms,
        "gap_p50_ms": outcome.gap_p50_ms,
        "gap_p99_ms": outcome.gap_p99_ms,
        "cancel_token_index": outcome.cancel_token_index,
        "tokens_after_cancel": outcome.tokens_after_cancel,
        "error": outcome.error,
    }


def stored_outcome(m: Message) -> Outcome:
    """A reply as the database has it, in the streaming core's terms.

    A row that never got its end written (still streaming, or interrupted at startup) has no
    counts or times: they read as 0 (`first_token_at`: None)."""
    return Outcome(
        message_id=str(m.id),
        status=m.status,
        finish_reason=m.finish_reason,
        text=m.content,
        prompt_tokens=m.prompt_tokens or 0,
        completion_tokens=m.completion_tokens or 0,
        queued_at=_seconds(m.queued_at) or 0.0,
        first_token_at=_seconds(m.first_token_at),
        finished_at=_seconds(m.finished_at) or 0.0,
        ttft_ms=m.ttft_ms,
        gap_p50_ms=m.gap_p50_ms,
        gap_p99_ms=m.gap_p99_ms,
        cancel_token_index=m.cancel_token_index,
        tokens_after_cancel=m.tokens_after_cancel,
        error=m.error,
    )


# --- the state machine ----------------------------------------------------------------------------


_MESSAGES = Message.__table__
_STILL_STREAMING = update(_MESSAGES).where(
    _MESSAGES.c.id == bindparam("reply_id"), _MESSAGES.c.status == Status.STREAMING
)
"""An UPDATE of one message (`reply_id`) that only applies while it is still streaming. Built once:
the hot paths below run prebuilt Core statements, since building one per call (the ORM's
`update(Message).values(...)`) cost more of the event loop than running it (bench/setup_cost.py,
py-spy). With no `.values()`, the SET clause is made of the parameters' other keys."""

# The UPDATE that flushes streaming replies' text so far (a no-op for one that is final), run
# once with a parameter set per reply (`progress_params`): one executemany, not a statement each.
PROGRESS_UPDATE = _STILL_STREAMING.values(
    content=bindparam("text_so_far"), completion_tokens=bindparam("tokens_so_far")
)


def progress_params(message_id: UUID, content: str, completion_tokens: int) -> dict[str, Any]:
    """One reply's parameters for `PROGRESS_UPDATE`."""
    return {"reply_id": message_id, "text_so_far": content, "tokens_so_far": completion_tokens}


FINAL_UPDATE = _STILL_STREAMING
"""The UPDATE that writes a reply's end (a no-op once it is final), with `final_params` per reply:
the recorder saves a batch of ends as one executemany."""


def final_params(outcome: Outcome) -> dict[str, Any]:
    """One reply's parameters for `FINAL_UPDATE`: its `Outcome` as it is."""
    if not outcome.status.is_final:
        raise ValueError(f"{outcome.status} is not a final status")
    return {"reply_id": UUID(outcome.message_id), **outcome_columns(outcome)}


def new_reply(
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
        status=Status.STREAMING,
        model=model,
        engine_request_id=engine_request_id,
        replica_id=replica_id,
        completion_tokens=0,
        created_at=created_at,
    )


async def _name_new_chat(
    session: AsyncSession, conversation_id: UUID, first_message: str
) -> str | None:
    """A new chat ("New chat") names itself from its first message, distinct from the owner's
    other chats ("… (2)"); returns its new title, None if it had one already. Read after
    write_turn's UPDATE: in the write transaction, so on SQLite the titles read are the latest
    (a read before the first write could not later upgrade)."""
    wanted = title_from_message(first_message)
    owner = select(Conversation.user_id).where(Conversation.id == conversation_id)
    taken = set(
        await session.scalars(titles_like(owner.scalar_subquery(), wanted, conversation_id))
    )
    title = distinct_title(wanted, taken)
    named = await session.execute(
        update(Conversation)
        .where(Conversation.id == conversation_id, Conversation.title == DEFAULT_TITLE)
        .values(title=title)
        .execution_options(synchronize_session=False)
    )
    return title if named.rowcount else None


class Turn(NamedTuple):
    """A turn's rows as written: the question, its `streaming` reply, and the conversation's new
    title when this first turn named it (None otherwise)."""

    question: Message
    reply: Message
    title: str | None = None


_CONVERSATIONS = Conversation.__table__
_CONVERSATION_COLUMNS = (
    "id",
    "user_id",
    "title",
    "source",
    "created_at",
    "updated_at",
    "current_leaf_id",
)
_INSERT_CONVERSATION = insert(_CONVERSATIONS)
_TAKE_CONVERSATION = update(_CONVERSATIONS).where(_CONVERSATIONS.c.id == bindparam("conversation"))
_INSERT_MESSAGES = insert(_MESSAGES)
# The columns `turn_rows` sets; the others take their defaults (the same Core column defaults the
# ORM would apply).
_TURN_COLUMNS = (
    "id",
    "parent_id",
    "conversation_id",
    "role",
    "content",
    "status",
    "model",
    "engine_request_id",
    "replica_id",
    "completion_tokens",
    "token_count",
    "window_start_id",
    "created_at",
)


def _row(record: Conversation | Message, columns: tuple[str, ...]) -> dict[str, Any]:
    """A not-yet-added ORM object's values for a Core INSERT of those columns."""
    return {name: getattr(record, name) for name in columns}


async def take_conversation(
    session: AsyncSession, conversation_id: UUID, now: datetime, leaf: UUID | None = None
) -> None:
    """Bump the conversation (and, given `leaf`, make it its current end; unarchived if it was)
    as a transaction's first write: its row lock (PostgreSQL) or the write lock (SQLite) is taken here, never after a read
    of it (see `write_turn`). Raises ConversationNotFoundError when it is gone.

    A prebuilt Core UPDATE of the table, not the ORM's: no object of the session changes, and the
    ORM's bulk-UPDATE path costs about as much again in Python (bench/setup_cost.py)."""
    # A new turn in an archived conversation brings it back to the list (app/domain/chat/
    # conversations.py, `file_conversation`): the user is using it again.
    values: dict[str, Any] = {
        "conversation": conversation_id,
        "updated_at": now,
        "archived_at": None,
    }
    if leaf is not None:
        values["current_leaf_id"] = leaf
    touched = await session.execute(_TAKE_CONVERSATION, values)
    if touched.rowcount == 0:
        raise ConversationNotFoundError(conversation_id)


async def _insert_turn(session: AsyncSession, question: Message, reply: Message) -> None:
    """Both rows in one INSERT (Core, as `take_conversation`: the objects stay out of the
    session, nothing is read back)."""
    await session.execute(_INSERT_MESSAGES, [_row(m, _TURN_COLUMNS) for m in (question, reply)])


def turn_rows(
    conversation_id: UUID,
    user_content: str,
    model: str | None,
    parent_id: UUID | None,
    *,
    engine_request_id: str | None,
    replica_id: str | None,
    now: datetime,
    window: Fitted | None = None,
) -> tuple[Message, Message]:
    """A turn's two rows, not yet added: the question following `parent_id`, and its (empty,
    `streaming`) reply stamped one microsecond later, so that ordering by `created_at` is total
    even on a coarse clock. `window`: the prompt's fitting (the question's id and token count,
    where the reply's window begins)."""
    question = Message(
        id=window.question_id if window else uuid4(),
        token_count=window.question_tokens if window else None,
        parent_id=parent_id,
        conversation_id=conversation_id,
        role=MessageRole.USER,
        content=user_content,
        status=Status.COMPLETED,
        created_at=now,
    )
    reply = new_reply(
        conversation_id, model, engine_request_id, replica_id, now + timedelta(microseconds=1)
    )
    reply.id, reply.parent_id = uuid4(), question.id
    reply.window_start_id = window.window_start_id if window else None
    return question, reply


async def write_turn(
    session: AsyncSession,
    conversation_id: UUID,
    user_content: str,
    model: str | None,
    *,
    parent_id: UUID | None,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
    title_if_untitled: str | None = None,
    window: Fitted | None = None,
) -> Turn:
    """A page turn's rows in the caller's transaction (which commits them): the question follows
    `parent_id` (the end of the branch its prompt was built on; None: a first question), the
    reply becomes the current leaf. Raises `ConversationNotFoundError`; ownership is the caller's
    business. Two statements when no title is wanted: the conversation's UPDATE (bump and leaf),
    both rows in one INSERT; nothing read back.

    The transaction starts with that conditional UPDATE, never a read: a DELETE racing it then
    either waits for this transaction (PostgreSQL's row lock; SQLite's write lock, taken by the
    first write) and removes the new rows with the conversation, or commits first and leaves
    nothing to update (ConversationNotFoundError). Reading first let the DELETE slip in between
    the read and the writes: the ORM's UPDATE then matched no row (StaleDataError, a 500)."""
    now = utcnow()
    question, reply = turn_rows(
        conversation_id,
        user_content,
        model,
        parent_id,
        engine_request_id=engine_request_id,
        replica_id=replica_id,
        now=now,
        window=window,
    )
    await take_conversation(session, conversation_id, now, reply.id)
    await store_counts(session, window.counted if window else {})
    title = None
    if title_if_untitled:
        title = await _name_new_chat(session, conversation_id, title_if_untitled)
    await _insert_turn(session, question, reply)
    return Turn(question, reply, title)


async def write_api_call(
    session: AsyncSession,
    user_id: UUID,
    question: str,
    model: str | None,
    *,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
) -> tuple[Message, Message]:
    """A `/v1` call's rows in the caller's transaction: its `api` conversation (titled from the
    question), the question and the streaming reply, its current leaf. Inserts only (prebuilt
    Core, as `write_turn`'s): nothing else can hold a conversation that does not exist yet."""
    now = utcnow()
    conversation = Conversation(
        id=uuid4(),
        user_id=user_id,
        title=clean_title(question[:API_TITLE_CHARS]),
        source=ConversationSource.API,
        created_at=now,
        updated_at=now,
    )
    asked, reply = turn_rows(
        conversation.id,
        question,
        model,
        None,
        engine_request_id=engine_request_id,
        replica_id=replica_id,
        now=now,
    )
    conversation.current_leaf_id = reply.id
    await session.execute(_INSERT_CONVERSATION, _row(conversation, _CONVERSATION_COLUMNS))
    await _insert_turn(session, asked, reply)
    if conversation.title == DEFAULT_TITLE:  # the question's start is all blanks
        await _name_new_chat(session, conversation.id, question)
    return asked, reply


async def mark_interrupted_at_startup(sessions: Sessions, replica_id: str | None = None) -> int:
    """Close every reply this replica left `streaming` when it died; returns how many.

    Call it once at startup, before serving. With `replica_id`, only that replica's rows (and rows
    with no replica recorded) are closed, so restarting one replica leaves its siblings' live
    replies alone; without it, every streaming row is closed (a single-process deployment).
    `finished_at` stays empty: when the reply really stopped is unknown.
    """
    condition = Message.status == Status.STREAMING
    if replica_id is not None:
        condition = condition & ((Message.replica_id == replica_id) | Message.replica_id.is_(None))
    async with transaction(sessions) as session:
        result = await session.execute(
            update(Message)
            .where(condition)
            .values(
                status=Status.INTERRUPTED,
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
                Message.conversation_id.in_(owned_conversation_ids(user_id)),
            )
            .values(client_ttft_ms=client_ttft_ms)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


async def get_message_unscoped(sessions: Sessions, message_id: UUID) -> Message | None:
    """A message by id for internal use (the caller already checked who may see it)."""
    async with transaction(sessions) as session:
        return await session.get(Message, message_id)
