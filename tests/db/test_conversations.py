"""An owner's conversations on real SQLite and PostgreSQL: titles, order, ownership, deletion."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import delete, func, select

from app.domain.accounts.models import User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, ConversationSource
from app.domain.chat.replies import rows as reply_rows
from tests.db.chat_rows import Sessions, add_turn, message_count, reload, shown_messages

MakeUser = Callable[..., Awaitable[User]]


async def test_create_conversation_cleans_the_title(db_sessions: Sessions, owner: User) -> None:
    conversation = await conversations.create_conversation(
        db_sessions, owner.id, "  a\n  b " + "x" * 300
    )
    assert conversation.title.startswith("a b x") and len(conversation.title) == 200
    assert conversation.source is ConversationSource.PAGE
    assert conversation.created_at.tzinfo is not None
    untitled = await conversations.create_conversation(db_sessions, owner.id, "  ", "api")
    assert untitled.title == conversations.DEFAULT_TITLE
    assert untitled.source is ConversationSource.API

    loaded = await conversations.get_conversation(db_sessions, owner.id, conversation.id)
    assert loaded is not None and loaded.title == conversation.title
    assert loaded.created_at == conversation.created_at
    assert loaded.created_at.utcoffset() == timedelta(0)


async def test_list_conversations_most_recent_first(db_sessions: Sessions, owner: User) -> None:
    older = await conversations.create_conversation(db_sessions, owner.id, "older")
    newer = await conversations.create_conversation(db_sessions, owner.id, "newer", "api")
    listed = await conversations.list_conversations(db_sessions, owner.id)
    assert [c.id for c in listed] == [newer.id, older.id]
    await add_turn(db_sessions, older.id, "bump", "m")
    listed = await conversations.list_conversations(db_sessions, owner.id)
    assert [c.id for c in listed] == [older.id, newer.id]
    from_api = await conversations.list_conversations(db_sessions, owner.id, source="api")
    assert [c.id for c in from_api] == [newer.id]
    first = await conversations.list_conversations(db_sessions, owner.id, limit=1)
    assert [c.id for c in first] == [older.id]


async def test_owner_scoping(
    db_sessions: Sessions, make_user: MakeUser, owner: User, conversation: Conversation
) -> None:
    stranger = await make_user("stranger@example.com")
    question, reply = await add_turn(db_sessions, conversation.id, "private", "m")

    assert await conversations.get_conversation(db_sessions, stranger.id, conversation.id) is None
    assert await conversations.list_conversations(db_sessions, stranger.id) == []
    assert await shown_messages(db_sessions, stranger.id, conversation.id) is None
    assert await conversations.get_message(db_sessions, stranger.id, reply.id) is None
    assert not await conversations.rename_conversation(
        db_sessions, stranger.id, conversation.id, "mine"
    )
    assert not await conversations.delete_conversation(db_sessions, stranger.id, conversation.id)
    assert not await reply_rows.record_client_ttft(db_sessions, stranger.id, reply.id, 12.0)
    assert await conversations.get_conversation(db_sessions, owner.id, uuid.uuid4()) is None
    assert await conversations.get_message(db_sessions, owner.id, uuid.uuid4()) is None

    # ... while the owner sees and changes everything.
    assert (await conversations.get_message(db_sessions, owner.id, reply.id)) is not None
    messages = await shown_messages(db_sessions, owner.id, conversation.id)
    assert [m.id for m in messages or []] == [question.id, reply.id]
    assert await conversations.rename_conversation(
        db_sessions, owner.id, conversation.id, " Renamed "
    )
    renamed = await conversations.get_conversation(db_sessions, owner.id, conversation.id)
    assert renamed is not None and renamed.title == "Renamed"
    assert await reply_rows.record_client_ttft(db_sessions, owner.id, reply.id, 123.5)
    assert (await reload(db_sessions, reply.id)).client_ttft_ms == 123.5
    assert not await reply_rows.record_client_ttft(db_sessions, owner.id, question.id, 1.0)
    with pytest.raises(ValueError):
        await reply_rows.record_client_ttft(db_sessions, owner.id, reply.id, -1.0)


async def test_delete_conversation_cascades_to_messages(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    kept = await conversations.create_conversation(db_sessions, owner.id, "kept")
    await add_turn(db_sessions, conversation.id, "a", "m")
    await add_turn(db_sessions, kept.id, "b", "m")
    assert await message_count(db_sessions) == 4

    assert await conversations.delete_conversation(db_sessions, owner.id, conversation.id)
    assert await conversations.get_conversation(db_sessions, owner.id, conversation.id) is None
    assert await message_count(db_sessions, conversation.id) == 0
    assert await message_count(db_sessions, kept.id) == 2
    assert not await conversations.delete_conversation(db_sessions, owner.id, conversation.id)


async def test_deleting_a_user_cascades_to_everything_they_own(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    await add_turn(db_sessions, conversation.id, "a", "m")
    async with db_sessions() as session, session.begin():
        await session.execute(delete(User).where(User.id == owner.id))
    async with db_sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Conversation)) == 0
    assert await message_count(db_sessions) == 0


def test_title_from_message_cuts_at_a_word_boundary_with_an_ellipsis() -> None:
    short = "How do I   reverse\na list in Python?"
    assert conversations.title_from_message(short) == "How do I reverse a list in Python?"
    long = "Explain how the streaming chat server resumes a reply after a dropped connection, step by step"
    title = conversations.title_from_message(long)
    assert title == "Explain how the streaming chat server resumes a reply after a dropped…"
    assert len(title) <= conversations.AUTO_TITLE_MAX_CHARS and long.startswith(title[:-1])
    one_word = "x" * 300
    assert conversations.title_from_message(one_word) == "x" * 79 + "…"
    assert conversations.title_from_message(" \n ") == conversations.DEFAULT_TITLE


async def test_first_messages_alike_give_distinct_titles(
    db_sessions: Sessions, owner: User, make_user: MakeUser
) -> None:
    """The same first message in three new chats: "t", "t (2)", "t (3)"; another user's chats
    and a chat's own title do not count."""
    question = "What is 100% of a_b? " + "and more words " * 8

    async def new_chat(user: User, first: str) -> str:
        chat = await conversations.create_conversation(db_sessions, user.id, None)
        await add_turn(db_sessions, chat.id, first, "m", title_if_untitled=first)
        await add_turn(db_sessions, chat.id, "again", "m", title_if_untitled="again")
        named = await conversations.get_conversation(db_sessions, user.id, chat.id)
        assert named is not None
        return named.title

    base = conversations.title_from_message(question)
    assert base.endswith("…")
    assert [await new_chat(owner, question) for _ in range(3)] == [
        base,
        f"{base} (2)",
        f"{base} (3)",
    ]
    other = await make_user("other@example.com")
    assert await new_chat(other, question) == base
    # A first message that differs only where the first has LIKE wildcards keeps its own title.
    assert await new_chat(owner, question.replace("%", "X").replace("_", "Y")) == base.replace(
        "%", "X"
    ).replace("_", "Y")
