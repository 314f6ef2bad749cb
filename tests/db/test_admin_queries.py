"""Admin queries on real SQLite and PostgreSQL: filters, search, pagination, outcomes over time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts.models import User
from app.domain.admin.queries import (
    ConversationFilter,
    StatusCount,
    admin_list_conversations,
    admin_list_messages,
    get_conversation_unscoped,
    message_status_counts,
)
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, ConversationSource, Message
from app.streaming.events import Status
from tests.db.chat_rows import add_turn, finish_reply

Sessions = async_sessionmaker[AsyncSession]
MakeUser = Callable[..., Awaitable[User]]
T0 = datetime(2030, 5, 6, 10, 0, tzinfo=UTC)


async def _set_times(sessions: Sessions, conversation_id: UUID, at: datetime) -> None:
    """Move a conversation and its messages to `at` (messages a second apart, in order)."""
    async with sessions() as session, session.begin():
        await session.execute(
            update(Conversation).where(Conversation.id == conversation_id).values(updated_at=at)
        )
        messages = await admin_list_messages(sessions, conversation_id)
        for n, message in enumerate(messages):
            await session.execute(
                update(Message)
                .where(Message.id == message.id)
                .values(created_at=at + timedelta(seconds=n))
            )


async def _conversation(
    sessions: Sessions,
    user: User,
    title: str,
    turns: list[tuple[str, str, Status]],
    at: datetime,
    source: ConversationSource = ConversationSource.PAGE,
) -> Conversation:
    conversation = await conversations.create_conversation(sessions, user.id, title, source)
    for question, answer, status in turns:
        _, reply = await add_turn(sessions, conversation.id, question, "m")
        if status is not Status.STREAMING:
            await finish_reply(sessions, reply.id, status, text=answer)
    await _set_times(sessions, conversation.id, at)
    return conversation


@pytest.fixture
async def seeded(db_sessions: Sessions, make_user: MakeUser) -> dict[str, object]:
    alice = await make_user("alice@example.com")
    bob = await make_user("bob@example.com")
    s = Status
    recipes = await _conversation(
        db_sessions,
        alice,
        "Recipes",
        [("how to bake bread", "Use flour", s.COMPLETED), ("and cake?", "Sugar", s.CANCELLED)],
        T0,
    )
    maths = await _conversation(
        db_sessions, alice, "Maths", [("what is 100% of 5", "5", s.COMPLETED)], T0 + timedelta(1)
    )
    travel = await _conversation(
        db_sessions,
        bob,
        "Travel plans",
        [("trip to Kyoto", "", s.FAILED)],
        T0 + timedelta(2),
        ConversationSource.API,
    )
    live = await _conversation(
        db_sessions, bob, "Live one", [("still going", "", s.STREAMING)], T0 + timedelta(3)
    )
    return {
        "alice": alice,
        "bob": bob,
        "recipes": recipes,
        "maths": maths,
        "travel": travel,
        "live": live,
    }


async def _ids(sessions: Sessions, **filters: object) -> list[UUID]:
    page = await admin_list_conversations(sessions, ConversationFilter(**filters), limit=100)  # type: ignore[arg-type]
    return [row.conversation.id for row in page.items]


async def test_lists_everyone_most_recent_first(db_sessions: Sessions, seeded: dict) -> None:
    page = await admin_list_conversations(db_sessions)
    assert [row.conversation.title for row in page.items] == [
        "Live one",
        "Travel plans",
        "Maths",
        "Recipes",
    ]
    assert page.total == 4 and not page.has_next
    rows = {row.conversation.title: row for row in page.items}
    assert rows["Recipes"].user_email == "alice@example.com"
    assert rows["Recipes"].message_count == 4
    assert rows["Recipes"].last_status is Status.CANCELLED
    assert rows["Live one"].last_status is Status.STREAMING
    assert rows["Travel plans"].last_status is Status.FAILED


async def test_filters(db_sessions: Sessions, seeded: dict) -> None:
    alice, bob = seeded["alice"].id, seeded["bob"].id
    recipes, maths = seeded["recipes"].id, seeded["maths"].id
    travel, live = seeded["travel"].id, seeded["live"].id

    assert await _ids(db_sessions, user_id=alice) == [maths, recipes]
    assert await _ids(db_sessions, user_id=bob) == [live, travel]
    assert await _ids(db_sessions, source=ConversationSource.API) == [travel]
    assert await _ids(db_sessions, status=Status.CANCELLED) == [recipes]
    assert await _ids(db_sessions, status=Status.COMPLETED) == [maths, recipes]
    assert await _ids(db_sessions, status=Status.STREAMING) == [live]
    assert await _ids(db_sessions, status=Status.INTERRUPTED) == []
    assert await _ids(
        db_sessions, updated_after=T0 + timedelta(1), updated_before=T0 + timedelta(3)
    ) == [travel, maths]
    assert await _ids(db_sessions, user_id=alice, status=Status.CANCELLED) == [recipes]
    assert await _ids(db_sessions, user_id=bob, status=Status.CANCELLED) == []


async def test_search_is_case_insensitive_over_titles_and_text(
    db_sessions: Sessions, seeded: dict
) -> None:
    assert await _ids(db_sessions, search="TRAVEL") == [seeded["travel"].id]  # title
    assert await _ids(db_sessions, search="kyoto") == [seeded["travel"].id]  # question
    assert await _ids(db_sessions, search="use FLOUR") == [seeded["recipes"].id]  # reply
    assert await _ids(db_sessions, search="100%") == [seeded["maths"].id]
    assert await _ids(db_sessions, search="%") == [seeded["maths"].id]  # a literal percent
    assert await _ids(db_sessions, search="_") == []  # a literal underscore
    assert await _ids(db_sessions, search="nothing like this") == []


async def test_pagination(db_sessions: Sessions, seeded: dict) -> None:
    first = await admin_list_conversations(db_sessions, limit=3)
    second = await admin_list_conversations(db_sessions, limit=3, offset=3)
    assert (len(first.items), first.total, first.has_next) == (3, 4, True)
    assert (len(second.items), second.total, second.has_next) == (1, 4, False)
    seen = [row.conversation.id for row in first.items + second.items]
    assert len(set(seen)) == 4
    filtered = await admin_list_conversations(
        db_sessions, ConversationFilter(user_id=seeded["alice"].id), limit=1
    )
    assert (filtered.total, len(filtered.items), filtered.has_next) == (2, 1, True)


async def test_message_status_counts_by_hour_and_day(db_sessions: Sessions, seeded: dict) -> None:
    s = Status
    by_day = await message_status_counts(
        db_sessions, since=T0 - timedelta(hours=1), until=T0 + timedelta(days=10), bucket="day"
    )
    day = T0.replace(hour=0)
    assert by_day == [
        StatusCount(day, s.CANCELLED, 1),
        StatusCount(day, s.COMPLETED, 1),
        StatusCount(day + timedelta(1), s.COMPLETED, 1),
        StatusCount(day + timedelta(2), s.FAILED, 1),
        StatusCount(day + timedelta(3), s.STREAMING, 1),
    ]
    assert all(count.bucket_start.tzinfo is not None for count in by_day)

    by_hour = await message_status_counts(
        db_sessions, since=T0, until=T0 + timedelta(days=1, hours=1), bucket="hour"
    )
    assert by_hour == [
        StatusCount(T0, s.CANCELLED, 1),
        StatusCount(T0, s.COMPLETED, 1),
        StatusCount(T0 + timedelta(1), s.COMPLETED, 1),
    ]

    everything = await message_status_counts(
        db_sessions, since=T0, until=T0 + timedelta(hours=1), role=None
    )
    assert everything == [StatusCount(T0, s.CANCELLED, 1), StatusCount(T0, s.COMPLETED, 3)]
    with pytest.raises(ValueError):
        await message_status_counts(db_sessions, since=T0, bucket="week")  # type: ignore[arg-type]


async def test_admin_sees_any_conversation_messages(db_sessions: Sessions, seeded: dict) -> None:
    messages = await admin_list_messages(db_sessions, seeded["recipes"].id)
    assert [m.content for m in messages] == ["how to bake bread", "Use flour", "and cake?", "Sugar"]
    conversation = await get_conversation_unscoped(db_sessions, seeded["recipes"].id)
    assert conversation is not None and conversation.title == "Recipes"
    assert await get_conversation_unscoped(db_sessions, uuid4()) is None
