"""What the admin's pages and JSON API share: a reply as the admin sees it, and the kill switch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import msgspec

from app.db.session import Sessions, transaction
from app.db.storage import StorageHealth
from app.domain.accounts import audit
from app.domain.accounts.audit import Actor
from app.domain.accounts.models import User
from app.domain.chat.models import Conversation, Message
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies.service import ReplyService
from app.domain.chat.schemas import MessageResponse
from app.streaming.events import CancelCause
from app.streaming.manager import GenerationManager


def stream_health_warning(message: Message) -> str | None:
    """A warning when the browser saw its first token much later than the engine produced it.

    That gap is time spent between the engine and the user: a proxy buffering the stream, most
    often. Small differences are network and rendering, so only a clear excess is flagged.
    """
    if message.client_ttft_ms is None or message.ttft_ms is None:
        return None
    excess = message.client_ttft_ms - message.ttft_ms
    if excess > max(500.0, 3 * message.ttft_ms):
        return (
            f"the browser saw the first token {excess:.0f} ms after the engine produced it: "
            "something between the server and the user (a proxy?) is buffering the stream"
        )
    return None


def message_row(m: Message) -> dict[str, Any]:
    """A message as its owner's API shows it, plus what only the admin sees; timestamps stay
    datetimes (the pages format them, the JSON API serialises them)."""
    return {
        **msgspec.structs.asdict(MessageResponse.of(m)),
        "created_at": m.created_at,
        "queued_at": m.queued_at,
        "first_token_at": m.first_token_at,
        "finished_at": m.finished_at,
        "client_ttft_ms": m.client_ttft_ms,
        "replica_id": m.replica_id,
        "stream_health_warning": stream_health_warning(m),
    }


async def kill_reply(replies: ReplyService, message_id: UUID, by: Actor) -> str | None:
    """Abort a reply wherever it runs, and audit it (`kill_reply`, naming the reply's owner);
    its status afterwards, or None if there is no such reply."""
    message = await reply_rows.get_message_unscoped(replies.sessions, message_id)
    if message is None or str(message.role) != "assistant":
        return None
    was = str(message.status)
    reply = replies.manager.get(str(message_id)) or message
    status = await replies.stop(reply, CancelCause.ADMIN)
    await _record_kill(replies.sessions, by, message, was, status)
    return status


async def _record_kill(
    sessions: Sessions, by: Actor, message: Message, was: str, status: str
) -> None:
    async with transaction(sessions) as session:
        conversation = await session.get(Conversation, message.conversation_id)
        owner = await session.get(User, conversation.user_id) if conversation else None
        await audit.record(
            session,
            by,
            "kill_reply",
            owner,
            message=str(message.id),
            conversation=str(message.conversation_id),
            was=was,
            status=status,
        )


def live_generations(
    manager: GenerationManager, emails: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The replies generating in this process now, and those that ended here but whose end is
    not saved yet (`saving`: the database is stalled; the save is retried), oldest first."""
    return [
        {
            "message_id": g.message_id,
            "conversation_id": g.conversation_id,
            "user_id": g.user_id,
            "user_email": (emails or {}).get(g.user_id, g.user_id),
            "source": g.source,
            "status": g.status.value,
            "tokens": g.tokens,
            "length": g.length,
            "subscribers": len(g.subscribers),
            "started_at": datetime.fromtimestamp(g.created_at, UTC).isoformat(),
            "saving": g.saving,
            "save_attempts": g.save_attempts,
            "save_error": g.save_error,
        }
        for g in manager.live()
    ]


def storage_alert(storage: StorageHealth) -> dict[str, Any] | None:
    """What the live view shows while the database refuses writes (app/db/storage.py), or None."""
    if storage.problem is None:
        return None
    return {
        "kind": storage.kind,
        "detail": storage.detail,
        "since": datetime.fromtimestamp(storage.since or 0, UTC),
        "refusals": storage.refusals,
    }
