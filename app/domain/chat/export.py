"""A conversation as a file: JSON (every row, every version, with its end state and timings and
the tree they form, read back by app/domain/chat/importing.py) or Markdown (the branch its owner
sees, for reading)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

import msgspec
from sqlalchemy import select

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.archive_schemas import (
    ACCOUNT_EXPORT_FORMAT,
    EXPORT_FORMAT,
    AccountExport,
    ConversationExport,
    ExportedConversation,
    ExportedMessage,
)
from app.domain.chat.models import Conversation, Message, MessageRole
from app.domain.chat.tree import Tree

ExportFormat = Literal["md", "json"]
MEDIA_TYPES = {"md": "text/markdown; charset=utf-8", "json": "application/json"}
END_STATE_NOTES = {
    "length": "stopped at the length limit",
    "cancelled": "stopped by the user",
    "disconnected": "the connection was lost",
    "failed": "failed",
    "interrupted": "interrupted by a server restart",
    "streaming": "still being written when exported",
}


async def conversation_rows(
    sessions: Sessions, conversation_id: UUID, user_id: UUID | None
) -> tuple[Conversation, list[Message]] | None:
    """The conversation and all its messages (every version), oldest first; scoped to
    `user_id` unless it is None (the admin's export). None when there is no such conversation."""
    found = select(Conversation).where(Conversation.id == conversation_id)
    if user_id is not None:
        found = found.where(Conversation.user_id == user_id)
    async with transaction(sessions) as session:
        conversation = await session.scalar(found)
        if conversation is None:
            return None
        messages = await session.scalars(
            select(Message)
            .where(Message.conversation_id == conversation_id)
            .order_by(Message.created_at)
        )
        return conversation, list(messages)


async def all_conversation_rows(
    sessions: Sessions, user_id: UUID
) -> list[tuple[Conversation, list[Message]]]:
    """Every conversation of the user's, oldest first, each with all its messages (one
    transaction: a consistent picture)."""
    async with transaction(sessions) as session:
        conversations = list(
            await session.scalars(
                select(Conversation)
                .where(Conversation.user_id == user_id)
                .order_by(Conversation.created_at, Conversation.id)
            )
        )
        messages = await session.scalars(
            select(Message)
            .join(Conversation, Conversation.id == Message.conversation_id)
            .where(Conversation.user_id == user_id)
            .order_by(Message.created_at)
        )
        by_conversation: dict[UUID, list[Message]] = {c.id: [] for c in conversations}
        for message in messages:
            if message.conversation_id in by_conversation:
                by_conversation[message.conversation_id].append(message)
    return [(c, by_conversation[c.id]) for c in conversations]


def render_account(rows: list[tuple[Conversation, list[Message]]]) -> ExportFile:
    """Every conversation in one JSON file (import reads it back: POST /api/account/import)."""
    bundle = AccountExport(
        format=ACCOUNT_EXPORT_FORMAT,
        exported_at=utcnow(),
        conversations=[to_export(c, m) for c, m in rows],
    )
    body = msgspec.json.format(msgspec.json.encode(bundle))
    return ExportFile(body, MEDIA_TYPES["json"], f"conversations-{utcnow():%Y-%m-%d}.json")


def to_export(conversation: Conversation, messages: list[Message]) -> ConversationExport:
    shown = Tree(messages).shown(conversation.current_leaf_id)
    return ConversationExport(
        format=EXPORT_FORMAT,
        exported_at=utcnow(),
        conversation=ExportedConversation(
            title=conversation.title,
            source=conversation.source,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
            current_leaf_id=shown[-1].id if shown else None,  # the leaf the page resolves to
        ),
        messages=[
            ExportedMessage(
                id=m.id,
                parent_id=m.parent_id,
                window_start_id=m.window_start_id,
                role=m.role,
                content=m.content,
                status=m.status,
                created_at=m.created_at,
                finish_reason=m.finish_reason,
                error=m.error,
                model=m.model,
                prompt_tokens=m.prompt_tokens,
                completion_tokens=m.completion_tokens,
                queued_at=m.queued_at,
                first_token_at=m.first_token_at,
                finished_at=m.finished_at,
                ttft_ms=m.ttft_ms,
                gap_p50_ms=m.gap_p50_ms,
                gap_p99_ms=m.gap_p99_ms,
                client_ttft_ms=m.client_ttft_ms,
                cancel_token_index=m.cancel_token_index,
                tokens_after_cancel=m.tokens_after_cancel,
            )
            for m in messages
        ],
    )


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """The chat as shown (the branch from the root to the current leaf; other versions left out),
    one section per message, each reply's end state noted when it did not simply complete."""
    lines = [f"# {conversation.title}", "", f"_Exported {utcnow():%Y-%m-%d %H:%M} UTC_", ""]
    for m in Tree(messages).shown(conversation.current_leaf_id):
        speaker = "You" if m.role == MessageRole.USER else str(m.role).capitalize()
        lines += [f"## {speaker}", "", m.content, ""]
        note = END_STATE_NOTES.get(str(m.status)) if m.role == MessageRole.ASSISTANT else None
        if note:
            lines += [f"_({note})_", ""]
    return "\n".join(lines)


def filename(conversation: Conversation, extension: ExportFormat) -> str:
    """A safe file name from the title (ASCII letters, digits and dashes)."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-")[:60] or "conversation"
    return f"{stem}.{extension}"


@dataclass(frozen=True, slots=True)
class ExportFile:
    body: bytes
    media_type: str
    name: str

    @property
    def headers(self) -> dict[str, str]:
        """A download, not a page: the browser saves it under `name`."""
        return {"Content-Disposition": f'attachment; filename="{self.name}"'}


def render(conversation: Conversation, messages: list[Message], fmt: ExportFormat) -> ExportFile:
    if fmt == "json":
        body = msgspec.json.format(msgspec.json.encode(to_export(conversation, messages)))
    else:
        body = to_markdown(conversation, messages).encode()
    return ExportFile(body, MEDIA_TYPES[fmt], filename(conversation, fmt))
