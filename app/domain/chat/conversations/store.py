"""An owner's conversations and messages: create, list, read, rename, pin, archive, delete.

Every function takes the app's `async_sessionmaker` and runs one short transaction of its own.
They are scoped to an owner (`user_id`): another user's ids behave as if they did not exist
(None / False), so the web layer can answer 404 without a separate permission check.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID, uuid4

from sqlalchemy import ColumnElement, Select, delete, func, select, tuple_, update

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.chat.models import Conversation, ConversationSource, Message
from app.domain.chat.settings.models import start_from_defaults
from app.domain.errors import DomainError

TITLE_MAX_CHARS = 200
DEFAULT_TITLE = "New chat"


class ConversationNotFoundError(DomainError, LookupError):
    """No conversation with this id."""

    status = 404
    message = "no such conversation"


def clean_title(title: str | None) -> str:
    """One line, at most TITLE_MAX_CHARS, never empty."""
    title = " ".join((title or "").split())
    return title[:TITLE_MAX_CHARS] or DEFAULT_TITLE


AUTO_TITLE_MAX_CHARS = 80
_ELLIPSIS = "…"


def title_from_message(content: str, limit: int = AUTO_TITLE_MAX_CHARS) -> str:
    """A new chat's title from its first message: one line, cut at a word boundary with "…"."""
    text = " ".join(content[: limit * 4].split())
    if len(text) <= limit:
        return text or DEFAULT_TITLE
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:  # a word boundary not too far back; else cut the long word
        cut = cut[:space]
    return cut.rstrip(" ,.;:!?-") + _ELLIPSIS


def distinct_title(title: str, taken: set[str]) -> str:
    """`title`, or `title (2)`, `title (3)`... : the first one not in `taken`."""
    if title not in taken:
        return title
    n = 2
    while f"{title} ({n})" in taken:
        n += 1
    return f"{title} ({n})"


def titles_like(user_id: Any, title: str, but: UUID) -> Select[Any]:
    """The titles of the user's other conversations that `distinct_title` must avoid.
    `user_id` may be a value or a scalar subquery."""
    return select(Conversation.title).where(
        Conversation.user_id == user_id,
        Conversation.id != but,
        (Conversation.title == title)
        | Conversation.title.startswith(f"{title} (", autoescape=True),
    )


def owned_conversation_ids(user_id: UUID) -> Select[Any]:
    """The ids of the user's conversations, to scope a query of messages to their owner."""
    return select(Conversation.id).where(Conversation.user_id == user_id)


async def create_conversation(
    sessions: Sessions,
    user_id: UUID,
    title: str | None,
    source: ConversationSource | str = ConversationSource.PAGE,
) -> Conversation:
    async with transaction(sessions) as session:
        conversation = Conversation(
            id=uuid4(), user_id=user_id, title=clean_title(title), source=ConversationSource(source)
        )
        session.add(conversation)
        if conversation.source is ConversationSource.PAGE:
            await start_from_defaults(session, conversation.id, user_id)
    return conversation


class ListKey(NamedTuple):
    """Where a page of the list starts: after the conversation listed last, known by its
    `updated_at` and `id`, and its `pinned_at` when it was a pinned one."""

    updated_at: datetime
    id: UUID
    pinned_at: datetime | None = None


async def list_conversations(
    sessions: Sessions,
    user_id: UUID,
    *,
    source: ConversationSource | str | None = None,
    limit: int = 100,
    after: ListKey | tuple[datetime, UUID] | None = None,
    archived: bool = False,
) -> list[Conversation]:
    """The user's conversations as the sidebar lists them: the pinned ones first (the newest pin
    first), then the others, most recently active first; archived ones left out. With
    `archived`, only the archived ones, most recently active first.

    The first `limit`, or the `limit` after the one whose key is `after`. Keyed by the last one
    seen, not an offset: a conversation that moves to the top meanwhile shifts no page (and the
    index on (user_id, updated_at) serves every page alike). A page that starts among the pinned
    ones runs on into the others, so the boundary between them loses or repeats none."""
    key = ListKey(*after) if after is not None else None
    owned = [Conversation.user_id == user_id]
    if source is not None:
        owned.append(Conversation.source == ConversationSource(source))
    by_activity = (Conversation.updated_at.desc(), Conversation.id.desc())
    async with transaction(sessions) as session:
        if archived:
            return list(
                await session.scalars(
                    _after_by_activity(owned, key, archived=True)
                    .order_by(*by_activity)
                    .limit(limit)
                )
            )
        rows: list[Conversation] = []
        if key is None or key.pinned_at is not None:
            pinned = select(Conversation).where(
                *owned, Conversation.pinned_at.is_not(None), Conversation.archived_at.is_(None)
            )
            if key is not None:
                pinned = pinned.where(
                    tuple_(Conversation.pinned_at, Conversation.id) < tuple_(key.pinned_at, key.id)
                )
            order = (Conversation.pinned_at.desc(), Conversation.id.desc())
            rows = list(await session.scalars(pinned.order_by(*order).limit(limit)))
            key = None  # the others, from their top
        if len(rows) < limit:
            rest = _after_by_activity(owned, key, archived=False).where(
                Conversation.pinned_at.is_(None)
            )
            rows += await session.scalars(rest.order_by(*by_activity).limit(limit - len(rows)))
        return rows


def _after_by_activity(
    owned: list[ColumnElement[bool]], key: ListKey | None, *, archived: bool
) -> Select[tuple[Conversation]]:
    archive = Conversation.archived_at
    query = select(Conversation).where(
        *owned, archive.is_not(None) if archived else archive.is_(None)
    )
    if key is not None:
        query = query.where(
            tuple_(Conversation.updated_at, Conversation.id) < tuple_(key.updated_at, key.id)
        )
    return query


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


class PinnedAndArchivedError(DomainError, ValueError):
    """Asked to pin and archive at once: a conversation is one or the other."""

    status = 400
    message = "a conversation is pinned or archived, not both"


async def file_conversation(
    sessions: Sessions,
    user_id: UUID,
    conversation_id: UUID,
    *,
    pinned: bool | None = None,
    archived: bool | None = None,
) -> Conversation | None:
    """Pin or unpin, archive or unarchive (None: leave as is); the conversation as it is now, or
    None when it is not the user's. Pinning an archived one brings it back; archiving a pinned
    one unpins it. Pinning again keeps its place, archiving again its date. `updated_at` stays:
    filing a conversation is not activity in it."""
    if pinned and archived:
        raise PinnedAndArchivedError
    now = utcnow()
    values: dict[str, Any] = {}
    if pinned is not None:
        values["pinned_at"] = func.coalesce(Conversation.pinned_at, now) if pinned else None
    if archived is not None:
        values["archived_at"] = func.coalesce(Conversation.archived_at, now) if archived else None
    if pinned:
        values["archived_at"] = None
    if archived:
        values["pinned_at"] = None
    owned = (Conversation.id == conversation_id, Conversation.user_id == user_id)
    async with transaction(sessions) as session:
        if values:
            await session.execute(
                update(Conversation)
                .where(*owned)
                .values(values)
                .execution_options(synchronize_session=False)
            )
        return await session.scalar(
            select(Conversation).where(*owned).execution_options(populate_existing=True)
        )


async def delete_conversation(sessions: Sessions, user_id: UUID, conversation_id: UUID) -> bool:
    """Delete a conversation and (by ON DELETE CASCADE) its messages."""
    async with transaction(sessions) as session:
        result = await session.execute(
            delete(Conversation)
            .where(Conversation.id == conversation_id, Conversation.user_id == user_id)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount > 0


async def get_message(sessions: Sessions, user_id: UUID, message_id: UUID) -> Message | None:
    async with transaction(sessions) as session:
        return await session.scalar(
            select(Message).where(
                Message.id == message_id,
                Message.conversation_id.in_(owned_conversation_ids(user_id)),
            )
        )
