"""Conversations and their messages.

An assistant message is created `streaming` in the same transaction as the user message it answers,
is flushed while it grows, and ends in exactly one final status (the streaming core's `Status`) with
the text produced so far. The row also keeps what is needed to judge the stream afterwards: token
counts, when it was queued and when its first token came, the gaps between tokens, where a Stop
landed and how many tokens the engine still produced after it, and the TTFT the browser saw.

Enums are stored as short strings with a CHECK constraint (not native PostgreSQL enums), so the
same migration serves SQLite and PostgreSQL and a new value is a plain constraint change.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from sqlalchemy import Enum, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base, CreatedAt, UUIDPrimaryKey, utcnow
from app.streaming.events import Status


class ConversationSource(StrEnum):
    PAGE = "page"  # the browser chat
    API = "api"  # the OpenAI-compatible endpoint


class MessageRole(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


def _str_enum(enum: type[StrEnum], name: str) -> Enum:
    """A VARCHAR holding the enum's values, guarded by a named CHECK constraint."""
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class Conversation(UUIDPrimaryKey, CreatedAt, Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_user_id_updated_at", "user_id", "updated_at"),)

    user_id: Mapped[UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200))
    source: Mapped[ConversationSource] = mapped_column(
        _str_enum(ConversationSource, "conversation_source"), default=ConversationSource.PAGE
    )
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, sort_order=101)
    # The end of the branch shown last (app/domain/chat/branches.py): the visible thread is the
    # path from the root to it. No foreign key: one back to `messages` would make the two tables a
    # cycle that SQLite cannot build; messages are only ever deleted with their conversation.
    current_leaf_id: Mapped[UUID | None] = mapped_column(default=None)
    # Filed by its owner (conversations.py, `file_conversation`): pinned ones lead the list, newest
    # pin first; archived ones leave it (still searched, exported, opened by address). Never both.
    pinned_at: Mapped[datetime | None] = mapped_column(default=None)
    archived_at: Mapped[datetime | None] = mapped_column(default=None)

    # Loaded only when asked for (selectinload); a lazy load in async code would raise anyway.
    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation",
        order_by="Message.created_at",
        cascade="all, delete-orphan",
        passive_deletes=True,
        lazy="raise",
    )

    def __repr__(self) -> str:
        return f"Conversation(id={self.id}, user_id={self.user_id}, title={self.title!r})"


class Message(UUIDPrimaryKey, CreatedAt, Base):
    __tablename__ = "messages"
    __table_args__ = (
        Index("ix_messages_conversation_id_created_at", "conversation_id", "created_at"),
        Index("ix_messages_status", "status"),
    )

    conversation_id: Mapped[UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    role: Mapped[MessageRole] = mapped_column(_str_enum(MessageRole, "message_role"))
    content: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[Status] = mapped_column(_str_enum(Status, "message_status"))
    finish_reason: Mapped[str | None] = mapped_column(String(32), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    model: Mapped[str | None] = mapped_column(String(200), default=None)
    engine_request_id: Mapped[str | None] = mapped_column(String(64), default=None)
    replica_id: Mapped[str | None] = mapped_column(String(64), default=None)  # who generates it

    prompt_tokens: Mapped[int | None] = mapped_column(default=None)
    completion_tokens: Mapped[int | None] = mapped_column(default=None)
    # Tokens this message takes in a prompt (its template framing included), counted once by the
    # engine (app/domain/chat/context_window.py); None until counted.
    token_count: Mapped[int | None] = mapped_column(default=None)
    # A reply's window: the first history message its prompt held (None: from the start).
    window_start_id: Mapped[UUID | None] = mapped_column(default=None)

    queued_at: Mapped[datetime | None] = mapped_column(default=None)
    first_token_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    ttft_ms: Mapped[float | None] = mapped_column(default=None)
    gap_p50_ms: Mapped[float | None] = mapped_column(default=None)
    gap_p99_ms: Mapped[float | None] = mapped_column(default=None)

    cancel_token_index: Mapped[int | None] = mapped_column(default=None)  # where Stop landed
    tokens_after_cancel: Mapped[int | None] = mapped_column(default=None)  # engine overrun
    client_ttft_ms: Mapped[float | None] = mapped_column(default=None)  # as the browser saw it
    # The message this one follows (a reply: its question; a question: the reply before it; the
    # first question: none). Siblings share a parent: edited questions, regenerated replies.
    parent_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), default=None, index=True
    )

    conversation: Mapped[Conversation] = relationship(back_populates="messages", lazy="raise")

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    def __repr__(self) -> str:
        return f"Message(id={self.id}, role={self.role}, status={self.status})"


class Rating(StrEnum):
    UP = "up"
    DOWN = "down"


class ReplyRating(CreatedAt, Base):
    """A user's thumbs up or down on an assistant reply, with an optional comment: one per reply
    and user (the primary key), changed in place, deleted when taken back."""

    __tablename__ = "reply_ratings"
    # The admin's ratings per day read by `updated_at` (when the verdict was last given).
    __table_args__ = (Index("ix_reply_ratings_updated_at", "updated_at"),)

    message_id: Mapped[UUID] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    rating: Mapped[Rating] = mapped_column(_str_enum(Rating, "reply_rating"))
    comment: Mapped[str | None] = mapped_column(Text, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, sort_order=101)
