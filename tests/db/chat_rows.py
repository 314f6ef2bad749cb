"""Helpers of the chat database tests: read rows back, and end replies as the ledger does."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.cancel_channel import LocalCancelChannel
from app.db.session import transaction
from app.domain.chat.conversations.branches import visible_thread
from app.domain.chat.conversations.store import ConversationNotFoundError
from app.domain.chat.models import Conversation, Message
from app.domain.chat.prompts.turns import next_turn
from app.domain.chat.replies import turn_rows
from app.domain.chat.replies.ledger import DatabaseLedger
from app.domain.chat.replies.rows import FINAL_UPDATE, final_params
from app.streaming.events import Status
from app.streaming.generation import Outcome
from app.streaming.ledger import Progress

Sessions = async_sessionmaker[AsyncSession]


def outcome(message_id: uuid.UUID, status: Status | str, **fields: Any) -> Outcome:
    """A reply's end as the streaming core reports it; unset fields are those of a reply that
    produced nothing (no text, no tokens, no timings), ending now."""
    now = time.time()
    ended: dict[str, Any] = {
        "finish_reason": None,
        "text": "",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "queued_at": now,
        "first_token_at": None,
        "finished_at": now,
        "ttft_ms": None,
        "gap_p50_ms": None,
        "gap_p99_ms": None,
        "cancel_token_index": None,
        "tokens_after_cancel": None,
        "error": None,
    }
    return Outcome(message_id=str(message_id), status=Status(status), **{**ended, **fields})


async def add_turn(
    sessions: Sessions,
    conversation_id: uuid.UUID,
    user_content: str,
    model: str | None,
    *,
    parent_id: uuid.UUID | None = None,
    title_if_untitled: str | None = None,
    engine_request_id: str | None = None,
    replica_id: str | None = None,
) -> tuple[Message, Message]:
    """A question and its `streaming` reply, committed, through the send's own write
    (`turn_rows.write_turn`): after `parent_id`, or, when None, after the conversation's current
    leaf (its end as shown; None in an empty conversation)."""
    async with transaction(sessions) as session:
        if parent_id is None:
            parent_id = await session.scalar(
                select(Conversation.current_leaf_id).where(Conversation.id == conversation_id)
            )
        question, reply, _ = await turn_rows.write_turn(
            session,
            conversation_id,
            user_content,
            model,
            parent_id=parent_id,
            engine_request_id=engine_request_id,
            replica_id=replica_id,
            title_if_untitled=title_if_untitled,
        )
    return question, reply


def ledger(sessions: Sessions) -> DatabaseLedger:
    """The streaming core's port over these rows, as one process (SQLite) has it."""
    return DatabaseLedger(sessions, LocalCancelChannel())


async def finish_reply(
    sessions: Sessions, message_id: uuid.UUID, status: Status | str, **fields: Any
) -> bool:
    """Write a reply's end (`outcome`'s fields) with the ledger's UPDATE; True if this call
    wrote it, False if the reply had already ended (or is not a reply)."""
    async with transaction(sessions) as session:
        result = await session.execute(
            FINAL_UPDATE, final_params(outcome(message_id, status, **fields))
        )
        return result.rowcount > 0


async def flush(sessions: Sessions, message_id: uuid.UUID, text: str, tokens: int) -> None:
    """One streaming reply's text so far, saved as the ledger saves it."""
    await ledger(sessions).save_progress([Progress(str(message_id), text, tokens)])


async def reload(sessions: Sessions, message_id: uuid.UUID) -> Message:
    async with sessions() as session:
        message = await session.get(Message, message_id)
        assert message is not None
        return message


async def message_count(sessions: Sessions, conversation_id: uuid.UUID | None = None) -> int:
    query = select(func.count()).select_from(Message)
    if conversation_id is not None:
        query = query.where(Message.conversation_id == conversation_id)
    async with sessions() as session:
        return await session.scalar(query) or 0


async def shown_messages(
    sessions: Sessions, user_id: uuid.UUID, conversation_id: uuid.UUID
) -> list[Message] | None:
    """The branch the conversation shows, as its owner's page reads it (branches.visible_thread),
    or None when it is not `user_id`'s (or not there)."""
    try:
        return (await visible_thread(sessions, user_id, conversation_id)).messages
    except ConversationNotFoundError:
        return None


async def branch_prompt(
    sessions: Sessions, conversation_id: uuid.UUID
) -> tuple[list[dict[str, str]], uuid.UUID | None]:
    """What a new turn of the conversation is built on, as a send reads it (prompts.next_turn):
    the branch shown as chat messages, oldest first, and the message a new question follows."""
    async with transaction(sessions) as session:
        owner = await session.scalar(
            select(Conversation.user_id).where(Conversation.id == conversation_id)
        )
        turn = await next_turn(session, owner, conversation_id)
    return turn.history, turn.parent_id


async def conversation_history(
    sessions: Sessions, conversation_id: uuid.UUID
) -> list[dict[str, str]]:
    """The branch shown as chat messages, oldest first (`branch_prompt`'s first half)."""
    return (await branch_prompt(sessions, conversation_id))[0]
