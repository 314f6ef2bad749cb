"""Chat persistence on real SQLite and PostgreSQL: the life of a reply, ownership, deletion."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.session import transaction
from app.domain.accounts.models import User
from app.domain.chat import service as chat
from app.domain.chat.models import (
    Conversation,
    ConversationSource,
    Message,
    MessageRole,
    MessageStatus,
)

Sessions = async_sessionmaker[AsyncSession]
MakeUser = Callable[..., Awaitable[User]]


async def _message_count(sessions: Sessions, conversation_id: uuid.UUID | None = None) -> int:
    query = select(func.count()).select_from(Message)
    if conversation_id is not None:
        query = query.where(Message.conversation_id == conversation_id)
    async with sessions() as session:
        return await session.scalar(query) or 0


async def _reload(sessions: Sessions, message_id: uuid.UUID) -> Message:
    async with sessions() as session:
        message = await session.get(Message, message_id)
        assert message is not None
        return message


@pytest.fixture
async def owner(make_user: MakeUser) -> User:
    return await make_user("owner@example.com")


@pytest.fixture
async def conversation(db_sessions: Sessions, owner: User) -> Conversation:
    return await chat.create_conversation(db_sessions, owner.id, "Hello", ConversationSource.PAGE)


def test_message_status_final_set() -> None:
    assert MessageStatus.FINAL == set(MessageStatus) - {MessageStatus.STREAMING}
    assert MessageStatus.CANCELLED.is_final and not MessageStatus.STREAMING.is_final


async def test_create_conversation_cleans_the_title(db_sessions: Sessions, owner: User) -> None:
    conversation = await chat.create_conversation(db_sessions, owner.id, "  a\n  b " + "x" * 300)
    assert conversation.title.startswith("a b x") and len(conversation.title) == 200
    assert conversation.source is ConversationSource.PAGE
    assert conversation.created_at.tzinfo is not None
    untitled = await chat.create_conversation(db_sessions, owner.id, "  ", "api")
    assert untitled.title == chat.DEFAULT_TITLE and untitled.source is ConversationSource.API

    loaded = await chat.get_conversation(db_sessions, owner.id, conversation.id)
    assert loaded is not None and loaded.title == conversation.title
    assert loaded.created_at == conversation.created_at
    assert loaded.created_at.utcoffset() == timedelta(0)


async def test_add_turn_creates_the_question_and_a_streaming_reply(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    user_message, reply = await chat.add_turn(
        db_sessions, conversation.id, "What is 2+2?", "smollm2", engine_request_id="req-1"
    )
    stored_user = await _reload(db_sessions, user_message.id)
    stored_reply = await _reload(db_sessions, reply.id)
    assert (stored_user.role, stored_user.status, stored_user.content) == (
        MessageRole.USER,
        MessageStatus.COMPLETED,
        "What is 2+2?",
    )
    assert (stored_reply.role, stored_reply.status, stored_reply.content) == (
        MessageRole.ASSISTANT,
        MessageStatus.STREAMING,
        "",
    )
    assert stored_reply.model == "smollm2" and stored_reply.engine_request_id == "req-1"
    assert stored_user.created_at < stored_reply.created_at
    refreshed = await chat.get_conversation(db_sessions, conversation.user_id, conversation.id)
    assert refreshed is not None and refreshed.updated_at >= stored_user.created_at


async def test_add_turn_names_an_untitled_conversation_once(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The first message titles a "New chat"; later ones (and a chosen title) are left alone."""
    owner = conversation.user_id
    await chat.rename_conversation(db_sessions, owner, conversation.id, chat.DEFAULT_TITLE)
    await chat.add_turn(db_sessions, conversation.id, "q", "m", title_if_untitled="First  question")
    await chat.add_turn(db_sessions, conversation.id, "q", "m", title_if_untitled="Second")
    named = await chat.get_conversation(db_sessions, owner, conversation.id)
    assert named is not None and named.title == "First question"


async def test_add_turn_is_one_transaction(
    db_sessions: Sessions, db_engine: AsyncEngine, conversation: Conversation
) -> None:
    """A failure once the reply's row is written leaves neither message, nor the bumped timestamp."""

    def fail_after_message_insert(conn, cursor, statement, parameters, *args) -> None:  # type: ignore[no-untyped-def]
        inserts_message = statement.lstrip().upper().startswith("INSERT INTO MESSAGES")
        if inserts_message and "streaming" in repr(parameters):
            raise RuntimeError("simulated crash after the reply's INSERT")

    event.listen(db_engine.sync_engine, "after_cursor_execute", fail_after_message_insert)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            await chat.add_turn(db_sessions, conversation.id, "hello?", "m")
    finally:
        event.remove(db_engine.sync_engine, "after_cursor_execute", fail_after_message_insert)

    assert await _message_count(db_sessions, conversation.id) == 0
    unchanged = await chat.get_conversation(db_sessions, conversation.user_id, conversation.id)
    assert unchanged is not None and unchanged.updated_at == conversation.updated_at


async def test_add_turn_to_a_missing_conversation(db_sessions: Sessions, owner: User) -> None:
    with pytest.raises(chat.ConversationNotFoundError):
        await chat.add_turn(db_sessions, uuid.uuid4(), "hi", "m")
    assert await _message_count(db_sessions) == 0


async def test_save_progress_then_finish(db_sessions: Sessions, conversation: Conversation) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "Tell me a story", "m")
    t0 = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

    assert await chat.save_progress(db_sessions, reply.id, "Once", 1, first_token_at=t0)
    assert await chat.save_progress(
        db_sessions, reply.id, "Once upon", 2, first_token_at=t0 + timedelta(seconds=1)
    )
    flushed = await _reload(db_sessions, reply.id)
    assert (flushed.content, flushed.completion_tokens) == ("Once upon", 2)
    assert flushed.first_token_at == t0  # the first one sticks
    assert flushed.status is MessageStatus.STREAMING

    done = await chat.finish_message(
        db_sessions,
        reply.id,
        MessageStatus.COMPLETED,
        content="Once upon a time.",
        finish_reason="stop",
        usage=chat.Usage(prompt_tokens=12, completion_tokens=5),
        timings=chat.Timings.from_epoch(
            queued_at=t0.timestamp() - 0.5,
            finished_at=t0.timestamp() + 2,
            ttft_ms=500.0,
            gap_p50_ms=20.0,
            gap_p99_ms=80.5,
        ),
        engine_request_id="req-9",
    )
    assert done
    final = await _reload(db_sessions, reply.id)
    assert final.status is MessageStatus.COMPLETED and final.is_final
    assert final.content == "Once upon a time."
    assert (final.finish_reason, final.prompt_tokens, final.completion_tokens) == ("stop", 12, 5)
    assert final.queued_at == t0 - timedelta(seconds=0.5)
    assert final.first_token_at == t0
    assert final.finished_at == t0 + timedelta(seconds=2)
    assert (final.ttft_ms, final.gap_p50_ms, final.gap_p99_ms) == (500.0, 20.0, 80.5)
    assert final.engine_request_id == "req-9" and final.error is None

    # A flush that lost the race against the finish changes nothing.
    assert not await chat.save_progress(db_sessions, reply.id, "Once upon a", 3)
    assert (await _reload(db_sessions, reply.id)).content == "Once upon a time."


async def test_final_status_is_never_overwritten(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "Go", "m")
    await chat.save_progress(db_sessions, reply.id, "partial", 7)
    assert await chat.finish_message(
        db_sessions,
        reply.id,
        "cancelled",
        finish_reason="cancelled",
        cancel=chat.CancelInfo(token_index=7, tokens_after_cancel=1),
    )
    for status in MessageStatus.FINAL:
        assert not await chat.finish_message(
            db_sessions, reply.id, status, content="other", error="late"
        )
    final = await _reload(db_sessions, reply.id)
    assert final.status is MessageStatus.CANCELLED
    assert final.content == "partial"  # content=None kept the flushed text
    assert (final.cancel_token_index, final.tokens_after_cancel) == (7, 1)
    assert final.error is None and final.finished_at is not None

    with pytest.raises(ValueError, match="not a final status"):
        await chat.finish_message(db_sessions, reply.id, MessageStatus.STREAMING)
    with pytest.raises(ValueError):
        await chat.finish_message(db_sessions, reply.id, "bogus")


async def test_concurrent_finishes_have_one_winner(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "Go", "m")
    statuses = [MessageStatus.COMPLETED, MessageStatus.CANCELLED, MessageStatus.DISCONNECTED] * 3
    results = await asyncio.gather(
        *(chat.finish_message(db_sessions, reply.id, s, content=str(s)) for s in statuses)
    )
    assert sum(results) == 1
    winner = statuses[results.index(True)]
    final = await _reload(db_sessions, reply.id)
    assert final.status is winner and final.content == str(winner)


async def test_finish_does_not_touch_user_messages(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    question, _ = await chat.add_turn(db_sessions, conversation.id, "Q", "m")
    assert not await chat.finish_message(db_sessions, question.id, "failed", error="x")
    assert (await _reload(db_sessions, question.id)).status is MessageStatus.COMPLETED


async def test_failed_reply_keeps_its_error(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "Q", "m")
    assert await chat.finish_message(
        db_sessions, reply.id, "failed", finish_reason="error", error="engine crashed"
    )
    final = await _reload(db_sessions, reply.id)
    assert (final.status, final.error, final.content) == (
        MessageStatus.FAILED,
        "engine crashed",
        "",
    )


async def test_mark_interrupted_at_startup(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, left_streaming = await chat.add_turn(db_sessions, conversation.id, "one", "m")
    await chat.save_progress(db_sessions, left_streaming.id, "half a repl", 4)
    _, also_streaming = await chat.add_turn(db_sessions, conversation.id, "two", "m")
    _, finished = await chat.add_turn(db_sessions, conversation.id, "three", "m")
    await chat.finish_message(db_sessions, finished.id, "length", content="full")

    assert await chat.mark_interrupted_at_startup(db_sessions) == 2
    interrupted = await _reload(db_sessions, left_streaming.id)
    assert interrupted.status is MessageStatus.INTERRUPTED
    assert interrupted.content == "half a repl" and interrupted.error
    assert (await _reload(db_sessions, also_streaming.id)).status is MessageStatus.INTERRUPTED
    assert (await _reload(db_sessions, finished.id)).status is MessageStatus.LENGTH

    assert await chat.mark_interrupted_at_startup(db_sessions) == 0
    assert not await chat.finish_message(db_sessions, left_streaming.id, "completed")


async def test_many_replies_flushing_at_once(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """What the streaming core does every second: concurrent flushes must not hit 'locked'."""
    replies = [
        (await chat.add_turn(db_sessions, conversation.id, f"q{i}", "m"))[1] for i in range(12)
    ]

    async def stream(reply: Message) -> None:
        for n in range(1, 6):
            assert await chat.save_progress(db_sessions, reply.id, "x" * n, n)
        assert await chat.finish_message(db_sessions, reply.id, "completed", content="done")

    await asyncio.gather(*(stream(reply) for reply in replies))
    for reply in replies:
        final = await _reload(db_sessions, reply.id)
        assert (final.status, final.completion_tokens) == (MessageStatus.COMPLETED, 5)


async def test_conversation_history_for_the_prompt(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await chat.add_turn(db_sessions, conversation.id, "first", "m")
    await chat.finish_message(db_sessions, r1.id, "completed", content="answer one")
    _, r2 = await chat.add_turn(db_sessions, conversation.id, "second", "m")
    await chat.finish_message(db_sessions, r2.id, "cancelled", content="cut sh")
    _, r3 = await chat.add_turn(db_sessions, conversation.id, "third", "m")
    await chat.finish_message(db_sessions, r3.id, "failed", error="boom")  # no text: left out
    await chat.add_turn(db_sessions, conversation.id, "fourth", "m")  # reply still streaming

    assert await chat.conversation_history(db_sessions, conversation.id) == [
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
    """The prompt is the history up to the question; the old reply is marked replaced and its
    successor streams; the chat and later prompts see the successor only."""
    _, r1 = await chat.add_turn(db_sessions, conversation.id, "first", "m")
    await chat.finish_message(db_sessions, r1.id, "completed", content="answer one")
    q2, r2 = await chat.add_turn(db_sessions, conversation.id, "second", "m")
    await chat.finish_message(db_sessions, r2.id, "completed", content="answer two")
    r2 = await _reload(db_sessions, r2.id)

    history, question = await chat.regeneration_prompt(db_sessions, r2)
    assert question == q2.id
    assert history == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
    ]
    new = await chat.replace_reply(db_sessions, r2, "m", engine_request_id="req")
    assert new.status is MessageStatus.STREAMING and new.created_at > r2.created_at
    assert (await _reload(db_sessions, r2.id)).replaced_at is not None
    await chat.finish_message(db_sessions, new.id, "completed", content="answer two, again")

    listed = await chat.list_messages(db_sessions, conversation.user_id, conversation.id)
    assert listed is not None
    assert [m.content for m in listed] == ["first", "answer one", "second", "answer two, again"]
    assert (await chat.conversation_history(db_sessions, conversation.id))[-1] == {
        "role": "assistant",
        "content": "answer two, again",
    }


async def test_only_the_latest_finished_reply_can_be_regenerated(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await chat.add_turn(db_sessions, conversation.id, "first", "m")
    await chat.finish_message(db_sessions, r1.id, "completed", content="one")
    _, r2 = await chat.add_turn(db_sessions, conversation.id, "second", "m")  # still streaming
    r1 = await _reload(db_sessions, r1.id)
    with pytest.raises(chat.NotRegenerableError, match="streaming"):
        await chat.regeneration_prompt(db_sessions, r2)
    with pytest.raises(chat.NotRegenerableError, match="latest"):
        await chat.regeneration_prompt(db_sessions, r1)
    with pytest.raises(chat.NotRegenerableError, match="latest"):
        await chat.replace_reply(db_sessions, r1, "m")
    assert (await _reload(db_sessions, r1.id)).replaced_at is None
    assert await _message_count(db_sessions, conversation.id) == 4


async def test_concurrent_regenerations_have_one_winner(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "Go", "m")
    await chat.finish_message(db_sessions, reply.id, "completed", content="done")
    reply = await _reload(db_sessions, reply.id)
    results = await asyncio.gather(
        *(chat.replace_reply(db_sessions, reply, "m") for _ in range(6)), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, Message)]
    assert len(winners) == 1, results
    assert all(isinstance(r, chat.NotRegenerableError) for r in results if r not in winners)
    assert await _message_count(db_sessions, conversation.id) == 3


async def test_list_conversations_most_recent_first(db_sessions: Sessions, owner: User) -> None:
    older = await chat.create_conversation(db_sessions, owner.id, "older")
    newer = await chat.create_conversation(db_sessions, owner.id, "newer", "api")
    assert [c.id for c in await chat.list_conversations(db_sessions, owner.id)] == [
        newer.id,
        older.id,
    ]
    await chat.add_turn(db_sessions, older.id, "bump", "m")
    listed = await chat.list_conversations(db_sessions, owner.id)
    assert [c.id for c in listed] == [older.id, newer.id]
    assert [c.id for c in await chat.list_conversations(db_sessions, owner.id, source="api")] == [
        newer.id
    ]
    assert [c.id for c in await chat.list_conversations(db_sessions, owner.id, limit=1)] == [
        older.id
    ]


async def test_owner_scoping(
    db_sessions: Sessions, make_user: MakeUser, owner: User, conversation: Conversation
) -> None:
    stranger = await make_user("stranger@example.com")
    question, reply = await chat.add_turn(db_sessions, conversation.id, "private", "m")

    assert await chat.get_conversation(db_sessions, stranger.id, conversation.id) is None
    assert await chat.list_conversations(db_sessions, stranger.id) == []
    assert await chat.list_messages(db_sessions, stranger.id, conversation.id) is None
    assert await chat.get_message(db_sessions, stranger.id, reply.id) is None
    assert not await chat.rename_conversation(db_sessions, stranger.id, conversation.id, "mine")
    assert not await chat.delete_conversation(db_sessions, stranger.id, conversation.id)
    assert not await chat.record_client_ttft(db_sessions, stranger.id, reply.id, 12.0)
    assert await chat.get_conversation(db_sessions, owner.id, uuid.uuid4()) is None
    assert await chat.get_message(db_sessions, owner.id, uuid.uuid4()) is None

    # ... while the owner sees and changes everything.
    assert (await chat.get_message(db_sessions, owner.id, reply.id)) is not None
    messages = await chat.list_messages(db_sessions, owner.id, conversation.id)
    assert [m.id for m in messages or []] == [question.id, reply.id]
    assert await chat.rename_conversation(db_sessions, owner.id, conversation.id, " Renamed ")
    renamed = await chat.get_conversation(db_sessions, owner.id, conversation.id)
    assert renamed is not None and renamed.title == "Renamed"
    assert await chat.record_client_ttft(db_sessions, owner.id, reply.id, 123.5)
    assert (await _reload(db_sessions, reply.id)).client_ttft_ms == 123.5
    assert not await chat.record_client_ttft(db_sessions, owner.id, question.id, 1.0)
    with pytest.raises(ValueError):
        await chat.record_client_ttft(db_sessions, owner.id, reply.id, -1.0)


async def test_delete_conversation_cascades_to_messages(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    kept = await chat.create_conversation(db_sessions, owner.id, "kept")
    await chat.add_turn(db_sessions, conversation.id, "a", "m")
    await chat.add_turn(db_sessions, kept.id, "b", "m")
    assert await _message_count(db_sessions) == 4

    assert await chat.delete_conversation(db_sessions, owner.id, conversation.id)
    assert await chat.get_conversation(db_sessions, owner.id, conversation.id) is None
    assert await _message_count(db_sessions, conversation.id) == 0
    assert await _message_count(db_sessions, kept.id) == 2
    assert not await chat.delete_conversation(db_sessions, owner.id, conversation.id)


async def test_deleting_a_user_cascades_to_everything_they_own(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    await chat.add_turn(db_sessions, conversation.id, "a", "m")
    async with db_sessions() as session, session.begin():
        await session.execute(delete(User).where(User.id == owner.id))
    async with db_sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Conversation)) == 0
    assert await _message_count(db_sessions) == 0


def test_timings_from_epoch() -> None:
    timings = chat.Timings.from_epoch(queued_at=0.0, first_token_at=None, ttft_ms=5.0)
    assert timings.queued_at == datetime(1970, 1, 1, tzinfo=UTC)
    assert timings.first_token_at is None and timings.ttft_ms == 5.0


async def test_progress_updates_batch_in_one_transaction(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The recorder flushes every running reply at once; a finished one is left alone."""
    _, running = await chat.add_turn(db_sessions, conversation.id, "a", "m")
    _, finished = await chat.add_turn(db_sessions, conversation.id, "b", "m")
    await chat.finish_message(db_sessions, finished.id, "completed", content="final")

    async with transaction(db_sessions) as session:
        results = [
            await session.execute(chat.progress_update(running.id, "partial", 3)),
            await session.execute(chat.progress_update(finished.id, "stale", 9)),
        ]
    assert [result.rowcount for result in results] == [1, 0]
    assert (await _reload(db_sessions, running.id)).content == "partial"
    assert (await _reload(db_sessions, finished.id)).content == "final"


async def test_get_message_unscoped(db_sessions: Sessions, conversation: Conversation) -> None:
    _, reply = await chat.add_turn(db_sessions, conversation.id, "a", "m")
    found = await chat.get_message_unscoped(db_sessions, reply.id)
    assert found is not None and found.id == reply.id
    assert await chat.get_message_unscoped(db_sessions, uuid.uuid4()) is None
