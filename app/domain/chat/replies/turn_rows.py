"""A turn's rows: the question and its `streaming` reply (or a `/v1` call's conversation), written
in the send's own transaction, with the conversation taken for the turn and a new chat named from
its first message. The reply row's life from there on: rows.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID, uuid4

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.domain.chat.conversations.store import (
    DEFAULT_TITLE,
    ConversationNotFoundError,
    clean_title,
    distinct_title,
    title_from_message,
    titles_like,
)
from app.domain.chat.models import Conversation, ConversationSource, Message, MessageRole
from app.domain.chat.prompts.token_counts import store_counts
from app.domain.chat.prompts.window import Fitted
from app.streaming.events import Status

_MESSAGES = Message.__table__
API_TITLE_CHARS = 80
"""A `/v1` call's conversation is titled with the start of its question."""


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
