"""The reply row's life, from `streaming` to its one final state, and its record of the reply.

A reply starts as an empty assistant message in state `streaming`, written with its question in
the send's own transaction (turn_rows.py: `write_turn`; a `/v1` call's: `write_api_call`); the ledger
(app/domain/chat/replies/ledger.py) flushes the partial text with `PROGRESS_UPDATE` and writes the end
with `FINAL_UPDATE`. Final states are never overwritten (the
updates are conditional on `status = 'streaming'`), so a late or duplicate finish, or a flush
racing the finish, cannot corrupt a reply. At startup, `mark_interrupted_at_startup` closes what a
dead server left streaming. Regenerate and edit add versions next to the old ones
(app/domain/chat/conversations/branches.py).

The row keeps the streaming core's `Outcome` field for field: `outcome_columns` writes it and
`stored_outcome` reads it back, and they are the only places that spell its fields for the
database.

Every function that touches the database takes the app's `async_sessionmaker` and runs one short
transaction of its own: the streaming core must never hold a session (or, on SQLite, the write
lock) while it waits for tokens.
"""

from __future__ import annotations

from datetime import UTC, datetime
from math import isfinite
from typing import Any
from uuid import UUID

from sqlalchemy import bindparam, update

from app.db.session import Sessions, transaction
from app.domain.chat.conversations.store import (
    owned_conversation_ids,
)
from app.domain.chat.models import Message, MessageRole
from app.domain.errors import DomainError, InvalidInputError
from app.streaming.events import Status
from app.streaming.generation import Outcome


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
        "stopped_by": outcome.stopped_by,
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
        stopped_by=m.stopped_by,
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
