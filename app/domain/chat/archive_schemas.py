"""The shapes of finding and keeping conversations, as msgspec structs: search results, the
export (JSON) that import reads back, and reply ratings.

The export is the rows as they are: every message of the conversation in order, assistant replies
that were regenerated included (`replaced_at` set), each with its end state and timings. It is
versioned (`format`, `version`) and read back strictly (`forbid_unknown_fields`, time zones
required, bounded sizes): a file that is not exactly an export is refused, saying where. Branches
(issue 11, item 1) will add an optional `parent_id` per message and bump `version`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from litestar.openapi.datastructures import ResponseSpec

from app.domain.chat.models import ConversationSource, MessageRole, Rating
from app.streaming.events import Status

EXPORT_FORMAT = "streamchat.conversation"
EXPORT_VERSION = 1
MAX_IMPORT_BYTES = 5_000_000
"""The largest JSON file import takes (Litestar answers 413 beyond it)."""
MAX_IMPORT_MESSAGES = 5000
MAX_IMPORT_MESSAGE_CHARS = 1_000_000

Moment = Annotated[datetime, msgspec.Meta(tz=True)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Millis = Annotated[float, msgspec.Meta(ge=0)]


class ExportedMessage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    role: MessageRole
    content: Annotated[str, msgspec.Meta(max_length=MAX_IMPORT_MESSAGE_CHARS)]
    status: Status
    created_at: Moment
    finish_reason: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    error: Annotated[str, msgspec.Meta(max_length=10_000)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    queued_at: Moment | None = None
    first_token_at: Moment | None = None
    finished_at: Moment | None = None
    ttft_ms: Millis | None = None
    gap_p50_ms: Millis | None = None
    gap_p99_ms: Millis | None = None
    client_ttft_ms: Millis | None = None
    cancel_token_index: Count | None = None
    tokens_after_cancel: Count | None = None
    replaced_at: Moment | None = None  # a regenerated reply, kept for the record


class ExportedConversation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    title: Annotated[str, msgspec.Meta(max_length=500)]
    source: ConversationSource
    created_at: Moment
    updated_at: Moment


class ConversationExport(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    format: Literal["streamchat.conversation"]
    version: Literal[1]
    exported_at: Moment
    conversation: ExportedConversation
    messages: Annotated[list[ExportedMessage], msgspec.Meta(max_length=MAX_IMPORT_MESSAGES)]


EXPORT_RESPONSE = {
    200: ResponseSpec(
        ConversationExport,
        media_type="application/json",
        description="the export as an attachment: this JSON, or with format=md text/markdown",
        generate_examples=False,
    )
}
"""The export routes' success, for the OpenAPI document (the handlers return raw bytes)."""


class SearchSnippet(msgspec.Struct):
    """Text around the match, in three parts: the page marks `match` without parsing markup."""

    before: str
    match: str
    after: str


class SearchResult(msgspec.Struct):
    conversation_id: str
    title: str
    updated_at: str
    message_id: str | None  # the matching message; null when the title matched
    snippet: SearchSnippet


class RateReply(msgspec.Struct, forbid_unknown_fields=True):
    rating: Rating
    comment: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class RatingResponse(msgspec.Struct):
    message_id: str
    rating: str
    comment: str | None
    updated_at: str
