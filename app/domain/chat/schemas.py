"""The chat protocol, as msgspec structs: what clients send, and what the page API answers.

One shape per request and per answer, shared by every transport (the page's SSE routes, the
WebSocket, whose frames extend the request structs in app/domain/chat/frames.py). Each answer is
built from its row in one place (`of`), and the handlers return the structs, so the OpenAPI
document describes exactly what goes over the wire. Ids are strings and times ISO 8601 strings,
as `str(uuid)` and `datetime.isoformat()` write them, which is what the pages read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.chat.branches import Thread
from app.domain.chat.models import Conversation, Message

# -- requests --------------------------------------------------------------------------------------


class NewConversation(msgspec.Struct, forbid_unknown_fields=True):
    title: str | None = None


class ConversationChanges(msgspec.Struct, forbid_unknown_fields=True):
    """PATCH of a conversation: rename it, pin or unpin it, archive or unarchive it (a field left
    out stays as it is; pinned and archived cannot both be true)."""

    title: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    pinned: bool | None = None
    archived: bool | None = None


class ReplyOptions(msgspec.Struct, forbid_unknown_fields=True):
    """Sampling settings a request may give for its reply (the server's defaults otherwise)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None


class SendMessage(ReplyOptions, kw_only=True):
    content: str


class SendTurn(SendMessage, kw_only=True):
    """A new question, after the message the sender's page shows last."""

    # The end of the branch on the sender's screen, which the new turn follows (so a tab that
    # has not heard of a version switch elsewhere still answers what it shows). None (or left
    # out): the branch the server shows, the conversation's current one.
    parent_id: UUID | None = None


class ResumeReply(msgspec.Struct, forbid_unknown_fields=True):
    """Follow a reply again from character offset `after` (what the client has already)."""

    message_id: UUID
    after: int = 0


class ShowBranch(msgspec.Struct, forbid_unknown_fields=True):
    """Show the branch through this message (one of the versions the switcher offers)."""

    message_id: UUID


class CancelReply(msgspec.Struct, forbid_unknown_fields=True):
    message_id: UUID


class ClientMetrics(msgspec.Struct):
    ttft_ms: float


# -- answers ---------------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class ConversationResponse(msgspec.Struct):
    id: str
    title: str
    source: str
    created_at: str
    updated_at: str
    pinned_at: str | None  # pinned: listed first, the newest pin first
    archived_at: str | None  # archived: out of the list, in the sidebar's "Archived"

    @classmethod
    def of(cls, c: Conversation) -> ConversationResponse:
        return cls(
            id=str(c.id),
            title=c.title,
            source=str(c.source),
            created_at=c.created_at.isoformat(),
            updated_at=c.updated_at.isoformat(),
            pinned_at=_iso(c.pinned_at),
            archived_at=_iso(c.archived_at),
        )


class MessageResponse(msgspec.Struct):
    """A message as its owner sees it (the admin sees more: app/domain/admin/views.py)."""

    id: str
    role: str
    content: str
    status: str
    finish_reason: str | None
    error: str | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    created_at: str | None
    first_token_at: str | None
    finished_at: str | None
    ttft_ms: float | None
    gap_p50_ms: float | None
    gap_p99_ms: float | None
    cancel_token_index: int | None
    tokens_after_cancel: int | None
    parent_id: str | None  # the message this one follows (app/domain/chat/tree.py)
    # A reply's context window (app/domain/chat/context_window.py): the first message of the
    # branch its prompt held (null: from the start; the question itself: no earlier message).
    window_start_id: str | None
    token_count: int | None  # tokens it takes in a prompt (null: not counted yet)

    @classmethod
    def of(cls, m: Message) -> MessageResponse:
        return cls(
            id=str(m.id),
            role=str(m.role),
            content=m.content,
            status=str(m.status),
            finish_reason=m.finish_reason,
            error=m.error,
            model=m.model,
            prompt_tokens=m.prompt_tokens,
            completion_tokens=m.completion_tokens,
            created_at=_iso(m.created_at),
            first_token_at=_iso(m.first_token_at),
            finished_at=_iso(m.finished_at),
            ttft_ms=m.ttft_ms,
            gap_p50_ms=m.gap_p50_ms,
            gap_p99_ms=m.gap_p99_ms,
            cancel_token_index=m.cancel_token_index,
            tokens_after_cancel=m.tokens_after_cancel,
            parent_id=str(m.parent_id) if m.parent_id else None,
            window_start_id=str(m.window_start_id) if m.window_start_id else None,
            token_count=m.token_count,
        )


class ThreadMessageResponse(MessageResponse):
    """A message of the branch shown, with the ids of its versions (itself included, oldest
    first): the page's "2/3" switcher."""

    siblings: list[str]


class ContextLimits(msgspec.Struct):
    """What the model takes for this conversation's next turn: the composer checks a message
    against `max_message_tokens` before sending (the server refuses a longer one with a 400)."""

    context_size: int  # tokens the model sees at once: prompt + reply
    reply_tokens: int  # of those, kept for the reply (its max_tokens)
    max_message_tokens: int  # the longest new message that fits (older turns make way for it)


class ConversationWithMessages(ConversationResponse):
    messages: list[ThreadMessageResponse]  # the branch shown (or a page of it), oldest first
    earlier: int = 0  # how many messages of the branch come before these (0: none)
    context: ContextLimits | None = None  # null: the engine is not running

    @classmethod
    def of_thread(
        cls, thread: Thread, page: tuple[int, int] | None = None
    ) -> ConversationWithMessages:
        """The thread, or the slice `page` (start, end) of its messages."""
        fields = msgspec.structs.asdict(ConversationResponse.of(thread.conversation))
        start, end = page or (0, len(thread.messages))
        messages = [
            ThreadMessageResponse(
                **msgspec.structs.asdict(MessageResponse.of(m)), siblings=thread.sibling_ids(m)
            )
            for m in thread.messages[start:end]
        ]
        return cls(**fields, messages=messages, earlier=start)


class StopResult(msgspec.Struct):
    """A stopped reply's status once its end is saved (or what it has in memory meanwhile)."""

    message_id: str
    status: str
