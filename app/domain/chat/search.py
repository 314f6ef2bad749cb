"""Search over one user's own conversations: titles and message text, case-insensitive.

Scoped by the owner first: every query joins the conversation and filters on its `user_id`, so
another user's text can never match. The pattern is a substring match (`LIKE`, with `%`, `_` and
the escape character in the query matching only themselves), the same SQL on SQLite and PostgreSQL,
both sides lowered (SQLite's lower() folds ASCII only; PostgreSQL's folds all of Unicode).

Why this is fast enough without a full-text index: a substring LIKE cannot use a b-tree, but it
never has to look past the owner's rows. The owner's conversations come from
`ix_conversations_user_id_updated_at`, their messages from `ix_messages_conversation_id_created_at`,
so the scan is one user's history, not the table, and each query stops at `MAX_HITS` rows. (A
trigram index, PostgreSQL's pg_trgm, would be the next step for users with huge histories; it has
no SQLite counterpart.)

Every version of every message is searched, not only the branch shown (app/domain/chat/tree.py):
the user wrote or was answered all of them, one switch away in the conversation, and which branch
is shown would take a walk up the tree per conversation. A hit opens the conversation (its branch
shown); the snippet still says what matched.

Archived conversations are searched like the others (archiving takes one out of the list, not out
of reach); each hit's conversation says whether it is archived, and the page marks it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import ColumnElement, func, select

from app.db.session import Sessions, transaction
from app.domain.chat.models import Conversation, ConversationSource, Message

MAX_HITS = 20
"""Conversations one search answers with (the newest first)."""
MAX_QUERY_CHARS = 200
SNIPPET_CONTEXT = 40
"""Characters shown either side of a match in a message."""


@dataclass(frozen=True, slots=True)
class Snippet:
    """The text around a match, cut in three so the page can mark the match without markup."""

    before: str
    match: str
    after: str


@dataclass(frozen=True, slots=True)
class SearchHit:
    conversation: Conversation
    message_id: UUID | None  # the matching message; None when the title matched
    snippet: Snippet


def _contains(column: ColumnElement[str], text: str) -> ColumnElement[bool]:
    """Case-insensitive substring match; `autoescape` makes `%`, `_` and `/` literal."""
    return func.lower(column).contains(text.lower(), autoescape=True)


def snippet(text: str, query: str, context: int = SNIPPET_CONTEXT) -> Snippet:
    """The first occurrence of `query` in `text` (ignoring case) with `context` characters either
    side, on one line; the whole start of `text` when the database matched what Python cannot
    find (a fold only one of them does)."""
    flat = " ".join(text.split())
    folded, wanted = flat.lower(), query.lower()
    at = folded.find(wanted) if len(folded) == len(flat) else -1
    if at < 0:
        return Snippet("", "", flat[: 2 * context] + ("…" if len(flat) > 2 * context else ""))
    end = at + len(wanted)
    start, stop = max(0, at - context), min(len(flat), end + context)
    return Snippet(
        ("…" if start > 0 else "") + flat[start:at],
        flat[at:end],
        flat[end:stop] + ("…" if stop < len(flat) else ""),
    )


async def search_conversations(
    sessions: Sessions, user_id: UUID, query: str, *, limit: int = MAX_HITS
) -> list[SearchHit]:
    """The user's page conversations whose title or any message (any version) contains `query`,
    most recently active first, one hit each (the newest matching message, else the title)."""
    query = " ".join(query.split())[:MAX_QUERY_CHARS]
    if not query:
        return []
    owned = (Conversation.user_id == user_id, Conversation.source == ConversationSource.PAGE)
    async with transaction(sessions) as session:
        titled = list(
            await session.scalars(
                select(Conversation)
                .where(*owned, _contains(Conversation.title, query))
                .order_by(Conversation.updated_at.desc())
                .limit(limit)
            )
        )
        in_text = (
            await session.execute(
                select(Conversation, Message.id, Message.content)
                .join(Message, Message.conversation_id == Conversation.id)
                .where(*owned, _contains(Message.content, query))
                .order_by(Conversation.updated_at.desc(), Message.created_at.desc())
                .limit(limit * 5)  # a few per conversation at most before `limit` are found
            )
        ).all()
    # A message's snippet says more than the title (shown with every hit anyway, and often the
    # first message itself): the title stands in only when no message matched.
    hits: dict[UUID, SearchHit] = {}
    for conversation, message_id, content in in_text:
        if conversation.id not in hits:
            hits[conversation.id] = SearchHit(conversation, message_id, snippet(content, query))
    for conversation in titled:
        if conversation.id not in hits:
            hits[conversation.id] = SearchHit(
                conversation, None, snippet(conversation.title, query)
            )
    ordered = sorted(hits.values(), key=lambda h: _newest_first(h.conversation.updated_at))
    return ordered[:limit]


def _newest_first(moment: datetime) -> float:
    return -moment.timestamp()
