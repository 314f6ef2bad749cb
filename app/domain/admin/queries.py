"""Read-only queries for the admin views: every user's conversations, and reply outcomes over time.

These are not scoped to an owner; the web layer must only expose them to admins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar
from uuid import UUID

from sqlalchemy import ColumnElement, Select, exists, func, literal_column, select

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts.models import User
from app.domain.chat.models import (
    Conversation,
    ConversationSource,
    Message,
    MessageRole,
    Rating,
    ReplyRating,
)
from app.streaming.events import Status

Bucket = Literal["hour", "day"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConversationFilter:
    """Every field is optional; set ones are combined with AND."""

    user_id: UUID | None = None
    source: ConversationSource | None = None
    status: Status | None = None  # has at least one assistant reply in this status
    updated_after: datetime | None = None  # last activity at or after
    updated_before: datetime | None = None  # last activity before
    search: str | None = None  # case-insensitive, in the title or any message's text
    rating: Rating | None = None  # has at least one reply rated so


@dataclass(frozen=True, slots=True)
class AdminConversationRow:
    conversation: Conversation
    user_email: str
    message_count: int
    last_status: Status | None  # of the latest assistant reply; None when there is none


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T] = field(default_factory=list)
    total: int = 0
    limit: int = 50
    offset: int = 0

    @property
    def has_next(self) -> bool:
        return self.offset + len(self.items) < self.total


@dataclass(frozen=True, slots=True)
class StatusCount:
    bucket_start: datetime  # UTC, truncated to the hour or the day
    status: Status
    count: int


def _contains(column: Any, text: str) -> ColumnElement[bool]:
    """Case-insensitive substring match; `%` and `_` in `text` match only themselves."""
    return func.lower(column).contains(text.lower(), autoescape=True)


def _conversation_conditions(filters: ConversationFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if filters.user_id is not None:
        conditions.append(Conversation.user_id == filters.user_id)
    if filters.source is not None:
        conditions.append(Conversation.source == ConversationSource(filters.source))
    if filters.updated_after is not None:
        conditions.append(Conversation.updated_at >= filters.updated_after)
    if filters.updated_before is not None:
        conditions.append(Conversation.updated_at < filters.updated_before)
    if filters.status is not None:
        conditions.append(
            exists().where(
                Message.conversation_id == Conversation.id,
                Message.role == MessageRole.ASSISTANT,  # questions are always "completed"
                Message.status == Status(filters.status),
            )
        )
    if filters.rating is not None:
        conditions.append(
            exists().where(
                ReplyRating.message_id == Message.id,
                Message.conversation_id == Conversation.id,
                ReplyRating.rating == Rating(filters.rating),
            )
        )
    if filters.search:
        conditions.append(
            _contains(Conversation.title, filters.search)
            | exists().where(
                Message.conversation_id == Conversation.id,
                _contains(Message.content, filters.search),
            )
        )
    return conditions


def _rows_query(conditions: list[ColumnElement[bool]]) -> Select[Any]:
    message_count = (
        select(func.count())
        .where(Message.conversation_id == Conversation.id)
        .correlate(Conversation)
        .scalar_subquery()
    )
    last_status = (
        select(Message.status)
        .where(Message.conversation_id == Conversation.id, Message.role == MessageRole.ASSISTANT)
        .order_by(Message.created_at.desc())
        .limit(1)
        .correlate(Conversation)
        .scalar_subquery()
    )
    return (
        select(Conversation, User.email, message_count, last_status)
        .join(User, User.id == Conversation.user_id)
        .where(*conditions)
    )


async def admin_list_conversations(
    sessions: Sessions,
    filters: ConversationFilter | None = None,
    *,
    limit: int = 50,
    offset: int = 0,
) -> Page[AdminConversationRow]:
    """All users' conversations matching `filters`, most recently active first, one page."""
    conditions = _conversation_conditions(filters or ConversationFilter())
    async with transaction(sessions) as session:
        total = await session.scalar(
            select(func.count()).select_from(Conversation).where(*conditions)
        )
        rows = await session.execute(
            _rows_query(conditions)
            .order_by(Conversation.updated_at.desc(), Conversation.id)
            .limit(limit)
            .offset(offset)
        )
        items = [
            AdminConversationRow(
                conversation=conversation,
                user_email=email,
                message_count=count,
                last_status=Status(status) if status is not None else None,
            )
            for conversation, email, count, status in rows
        ]
    return Page(items=items, total=total or 0, limit=limit, offset=offset)


async def get_conversation_unscoped(
    sessions: Sessions, conversation_id: UUID
) -> Conversation | None:
    """Any user's conversation by id (the admin's read-only view of a chat)."""
    async with transaction(sessions) as session:
        return await session.get(Conversation, conversation_id)


async def admin_list_messages(sessions: Sessions, conversation_id: UUID) -> list[Message]:
    """Any conversation's messages in order (the admin's read-only view of a chat)."""
    async with transaction(sessions) as session:
        return list(
            await session.scalars(
                select(Message)
                .where(Message.conversation_id == conversation_id)
                .order_by(Message.created_at)
            )
        )


def _bucket_expression(dialect: str, bucket: Bucket) -> ColumnElement[Any]:
    """`created_at` truncated to the bucket, in UTC. The unit is a literal, not a parameter, so
    PostgreSQL sees the same expression in SELECT and GROUP BY."""
    if bucket not in ("hour", "day"):
        raise ValueError(f"unknown bucket {bucket!r}")
    if dialect == "postgresql":
        utc = func.timezone(literal_column("'UTC'"), Message.created_at)
        return func.date_trunc(literal_column(f"'{bucket}'"), utc)
    pattern = "%Y-%m-%d %H:00:00" if bucket == "hour" else "%Y-%m-%d 00:00:00"
    return func.strftime(literal_column(f"'{pattern}'"), Message.created_at)


def _as_utc(value: datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def message_status_counts(
    sessions: Sessions,
    *,
    since: datetime,
    until: datetime | None = None,
    bucket: Bucket = "hour",
    role: MessageRole | None = MessageRole.ASSISTANT,
) -> list[StatusCount]:
    """How many messages (replies, by default) were created per bucket and status, oldest first.

    Buckets with no messages are absent. Only `streaming` rows may still change status later.
    """
    until = until or utcnow()
    async with transaction(sessions) as session:
        bucket_start = _bucket_expression(session.get_bind().dialect.name, bucket).label("bucket")
        query = (
            select(bucket_start, Message.status, func.count())
            .where(Message.created_at >= since, Message.created_at < until)
            .group_by(bucket_start, Message.status)
            .order_by(bucket_start, Message.status)
        )
        if role is not None:
            query = query.where(Message.role == role)
        rows = await session.execute(query)
        return [
            StatusCount(bucket_start=_as_utc(start), status=Status(status), count=count)
            for start, status, count in rows
        ]


@dataclass(frozen=True, slots=True)
class ReplyTimings:
    ttft_ms: list[float]
    gap_p50_ms: list[float]
    gap_p99_ms: list[float]


async def recent_reply_timings(sessions: Sessions, *, limit: int = 2000) -> ReplyTimings:
    """TTFT and inter-token gaps of the latest finished replies, for the admin's distributions."""
    async with transaction(sessions) as session:
        rows = (
            await session.execute(
                select(Message.ttft_ms, Message.gap_p50_ms, Message.gap_p99_ms)
                .where(Message.role == MessageRole.ASSISTANT, Message.ttft_ms.is_not(None))
                .order_by(Message.created_at.desc())
                .limit(limit)
            )
        ).all()
    return ReplyTimings(
        ttft_ms=[r[0] for r in rows],
        gap_p50_ms=[r[1] for r in rows if r[1] is not None],
        gap_p99_ms=[r[2] for r in rows if r[2] is not None],
    )


@dataclass(frozen=True, slots=True)
class RatingCount:
    day: datetime  # UTC midnight
    rating: Rating
    count: int


def _day_expression(dialect: str) -> ColumnElement[Any]:
    """`updated_at` (when the rating was last given) truncated to the UTC day; see
    `_bucket_expression` for why the unit is a literal."""
    if dialect == "postgresql":
        utc = func.timezone(literal_column("'UTC'"), ReplyRating.updated_at)
        return func.date_trunc(literal_column("'day'"), utc)
    return func.strftime(literal_column("'%Y-%m-%d 00:00:00'"), ReplyRating.updated_at)


async def rating_counts_per_day(
    sessions: Sessions, *, since: datetime, until: datetime | None = None
) -> list[RatingCount]:
    """Ratings per UTC day (by when they were last given) and verdict, oldest first; days with
    none are absent. Uses `ix_reply_ratings_updated_at`."""
    until = until or utcnow()
    async with transaction(sessions) as session:
        day = _day_expression(session.get_bind().dialect.name).label("day")
        rows = await session.execute(
            select(day, ReplyRating.rating, func.count())
            .where(ReplyRating.updated_at >= since, ReplyRating.updated_at < until)
            .group_by(day, ReplyRating.rating)
            .order_by(day, ReplyRating.rating)
        )
        return [RatingCount(_as_utc(d), Rating(r), n) for d, r, n in rows]
