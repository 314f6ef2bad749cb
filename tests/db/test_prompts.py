"""What the model is shown, on real SQLite and PostgreSQL: the history, and a regeneration's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import delete, event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.session import transaction
from app.domain.accounts.models import User
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, Message
from app.domain.chat.prompts import turns as prompts
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.settings import service as chat_settings
from app.domain.chat.settings.schemas import ChatSettings
from app.domain.errors import NotLoggedInError
from app.streaming.events import Status
from tests.db.chat_rows import (
    Sessions,
    add_turn,
    conversation_history,
    finish_reply,
    message_count,
    reload,
    shown_messages,
)


async def test_conversation_history_for_the_prompt(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="answer one")
    _, r2 = await add_turn(db_sessions, conversation.id, "second", "m")
    await finish_reply(db_sessions, r2.id, "cancelled", text="cut sh")
    _, r3 = await add_turn(db_sessions, conversation.id, "third", "m")
    await finish_reply(db_sessions, r3.id, "failed", error="boom")  # no text: left out
    await add_turn(db_sessions, conversation.id, "fourth", "m")  # still streaming

    assert await conversation_history(db_sessions, conversation.id) == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "cut sh"},
        {"role": "user", "content": "third"},
        {"role": "user", "content": "fourth"},
    ]


async def test_regenerating_the_latest_reply(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The prompt is the branch up to the question; the new reply is a version next to the old
    one and is shown from now on; the chat and later prompts see it, not the old one."""
    _, r1 = await add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="answer one")
    q2, r2 = await add_turn(db_sessions, conversation.id, "second", "m")
    await finish_reply(db_sessions, r2.id, "completed", text="answer two")
    r2 = await reload(db_sessions, r2.id)

    history, question = await prompts.regeneration_prompt(db_sessions, r2)
    assert question == q2.id
    assert history == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
    ]
    new = await branches.add_sibling_reply(db_sessions, r2, "m", engine_request_id="req")
    assert new.status is Status.STREAMING and new.created_at > r2.created_at
    assert new.parent_id == r2.parent_id == q2.id
    await finish_reply(db_sessions, new.id, "completed", text="answer two, again")

    listed = await shown_messages(db_sessions, conversation.user_id, conversation.id)
    assert listed is not None
    assert [m.content for m in listed] == ["first", "answer one", "second", "answer two, again"]
    assert (await conversation_history(db_sessions, conversation.id))[-1] == {
        "role": "assistant",
        "content": "answer two, again",
    }
    # The old version is still there, and can itself be answered again: a third version.
    r2 = await reload(db_sessions, r2.id)
    assert (await prompts.regeneration_prompt(db_sessions, r2))[1] == q2.id


async def test_only_the_latest_finished_reply_can_be_regenerated(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="one")
    _, r2 = await add_turn(db_sessions, conversation.id, "second", "m")  # streaming
    r1 = await reload(db_sessions, r1.id)
    with pytest.raises(reply_rows.NotRegenerableError, match="streaming"):
        await prompts.regeneration_prompt(db_sessions, r2)
    with pytest.raises(reply_rows.NotRegenerableError, match="streaming"):
        await branches.add_sibling_reply(db_sessions, r2, "m")
    with pytest.raises(reply_rows.NotRegenerableError, match="latest"):
        await prompts.regeneration_prompt(db_sessions, r1)
    with pytest.raises(reply_rows.NotRegenerableError, match="latest"):
        await branches.add_sibling_reply(db_sessions, r1, "m")
    assert await message_count(db_sessions, conversation.id) == 4


async def test_a_racing_delete_is_the_conversation_not_found(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """A regenerate or an edit that read its message before a delete finds the conversation gone,
    whichever half of the delete it sees: the conversation row gone, or (SQLite's reads outside a
    write are separate snapshots) the conversation still there and its messages gone."""
    question, reply = await add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, reply.id, "completed", text="one")
    reply = await reload(db_sessions, reply.id)
    async with db_sessions() as session, session.begin():  # the delete's first half, as seen
        await session.execute(delete(Message).where(Message.conversation_id == conversation.id))
    with pytest.raises(conversations.ConversationNotFoundError):
        await prompts.regeneration_prompt(db_sessions, reply)
    with pytest.raises(conversations.ConversationNotFoundError):
        await prompts.edit_prompt(db_sessions, question, "again")

    assert await conversations.delete_conversation(
        db_sessions, conversation.user_id, conversation.id
    )
    with pytest.raises(conversations.ConversationNotFoundError):
        await prompts.regeneration_prompt(db_sessions, reply)
    with pytest.raises(conversations.ConversationNotFoundError):
        await prompts.edit_prompt(db_sessions, question, "again")


async def test_next_turn_reads_what_a_send_builds_on_in_one_query(
    db_sessions: Sessions, db_engine: AsyncEngine, conversation: Conversation
) -> None:
    """The branch shown, the conversation's settings and the parent of the next question: the
    same as the separate reads give, from one statement."""
    _, r1 = await add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="answer one")
    q2, r2 = await add_turn(db_sessions, conversation.id, "second", "m")
    await finish_reply(db_sessions, r2.id, "completed", text="answer two")
    other = await branches.add_sibling_reply(db_sessions, r2, "m")  # now shown: r2 is hidden
    await finish_reply(db_sessions, other.id, "completed", text="answer two, again")
    chosen = ChatSettings(system_prompt="Be brief.", temperature=0.4)
    await chat_settings.save_for_conversation(
        db_sessions, conversation.user_id, conversation.id, chosen
    )

    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(db_engine.sync_engine, "before_cursor_execute", count)
    try:
        async with transaction(db_sessions) as session:
            turn = await prompts.next_turn(session, conversation.user_id, conversation.id)
    finally:
        event.remove(db_engine.sync_engine, "before_cursor_execute", count)

    assert len(statements) == 1
    assert turn.settings == chosen and turn.title == "Hello" and not turn.untitled
    assert turn.parent_id == other.id
    assert turn.history == await conversation_history(db_sessions, conversation.id)
    assert turn.prompt("third") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "answer two, again"},
        {"role": "user", "content": "third"},
    ]
    assert other.parent_id == q2.id


async def test_next_turn_of_an_empty_conversation_and_of_someone_elses(
    db_sessions: Sessions, conversation: Conversation, make_user: Any
) -> None:
    async with transaction(db_sessions) as session:
        empty = await prompts.next_turn(session, conversation.user_id, conversation.id)
    assert (empty.history, empty.parent_id, empty.settings) == ([], None, ChatSettings())

    stranger = await make_user("stranger@example.com")
    async with transaction(db_sessions) as session:
        with pytest.raises(conversations.ConversationNotFoundError):
            await prompts.next_turn(session, stranger.id, conversation.id)
        with pytest.raises(conversations.ConversationNotFoundError):
            await prompts.next_turn(session, conversation.user_id, uuid.uuid4())


async def test_next_turn_for_a_deleted_account_is_not_logged_in(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The send's query stands in for the session's user lookup: no user row, no send."""
    async with transaction(db_sessions) as session:
        await session.execute(delete(User).where(User.id == conversation.user_id))
    async with transaction(db_sessions) as session:
        with pytest.raises(NotLoggedInError):
            await prompts.next_turn(session, conversation.user_id, conversation.id)
