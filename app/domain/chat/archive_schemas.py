"""The shapes of finding and keeping conversations, as msgspec structs: search results, the
export (JSON) that import reads back, and reply ratings.

The export is the rows as they are: every message of the conversation, every version of every turn
included (edited questions, regenerated replies), each with its end state and timings. Version 2
keeps the tree (app/domain/chat/tree.py): each message's `id` and the `parent_id` it follows, and
the conversation's `current_leaf_id`, the end of the branch shown. Version 1 (before branches) was
one line, regenerated replies marked `replaced_at`; import still reads it. A reply's
`window_start_id` says what the model saw of the history for it (app/domain/chat/context_window.py). Both are read back
strictly (`forbid_unknown_fields`, time zones required, bounded sizes, the tag `version` picking
the shape): a file that is not exactly an export is refused, saying where.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec
from litestar.openapi.datastructures import ResponseSpec

from app.domain.chat.models import ConversationSource, MessageRole, Rating
from app.streaming.events import Status

EXPORT_FORMAT = "streamchat.conversation"
MAX_IMPORT_BYTES = 5_000_000
"""The largest JSON file import takes (Litestar answers 413 beyond it)."""
MAX_IMPORT_MESSAGES = 5000
MAX_IMPORT_MESSAGE_CHARS = 1_000_000

Moment = Annotated[datetime, msgspec.Meta(tz=True)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Millis = Annotated[float, msgspec.Meta(ge=0)]


class _MessageFields(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What every version of the format says about a message."""

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


class ExportedMessage(_MessageFields, kw_only=True):
    id: UUID  # as the exporting server knew it: what `parent_id` and `current_leaf_id` refer to
    parent_id: UUID | None = None  # the message it follows; none for a first question
    # A reply's context window: the first message its prompt held (none: from the start). Token
    # counts are not exported: they are the exporting model's; the importer's engine counts anew.
    window_start_id: UUID | None = None


class ExportedMessageV1(_MessageFields, kw_only=True):
    replaced_at: Moment | None = None  # a regenerated reply, kept for the record


class ExportedConversationV1(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    title: Annotated[str, msgspec.Meta(max_length=500)]
    source: ConversationSource
    created_at: Moment
    updated_at: Moment


class ExportedConversation(ExportedConversationV1, kw_only=True):
    current_leaf_id: UUID | None = None  # the end of the branch shown; none without messages


class _Export(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, tag_field="version"):
    format: Literal["streamchat.conversation"]
    exported_at: Moment


class ConversationExport(_Export, kw_only=True, tag=2):
    """The export this server writes: the tree."""

    conversation: ExportedConversation
    messages: Annotated[list[ExportedMessage], msgspec.Meta(max_length=MAX_IMPORT_MESSAGES)]


class ConversationExportV1(_Export, kw_only=True, tag=1):
    """An export written before branches: one line of messages, oldest first."""

    conversation: ExportedConversationV1
    messages: Annotated[list[ExportedMessageV1], msgspec.Meta(max_length=MAX_IMPORT_MESSAGES)]


AnyConversationExport = ConversationExport | ConversationExportV1
"""What import reads: `version` says which."""

ACCOUNT_EXPORT_FORMAT = "streamchat.conversations"
MAX_ACCOUNT_IMPORT_BYTES = 50_000_000
MAX_ACCOUNT_CONVERSATIONS = 10_000


class AccountExport(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every conversation of one account in one file (the account page's export): each entry is
    exactly a one-conversation export, so one can also be cut out and imported alone."""

    format: Literal["streamchat.conversations"]
    exported_at: Moment
    conversations: Annotated[
        list[AnyConversationExport], msgspec.Meta(max_length=MAX_ACCOUNT_CONVERSATIONS)
    ]


class ExportFormatOnly(msgspec.Struct):
    """The `format` of a file, whatever else it holds (to say which import reads it)."""

    format: str = ""


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
    archived: bool = False  # out of the list, in the sidebar's "Archived"


class RateReply(msgspec.Struct, forbid_unknown_fields=True):
    rating: Rating
    comment: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class RatingResponse(msgspec.Struct):
    message_id: str
    rating: str
    comment: str | None
    updated_at: str


ACCOUNT_EXPORT_RESPONSE = {
    200: ResponseSpec(
        AccountExport,
        media_type="application/json",
        description="every conversation of the user's, as an attachment",
        generate_examples=False,
    )
}
"""The account export's success, for the OpenAPI document (the handler returns raw bytes)."""
