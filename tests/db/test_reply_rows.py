"""The reply row on real SQLite and PostgreSQL: from `streaming` to one final state, its record of
the reply (the streaming core's Outcome, as it is), and the races around both."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.session import transaction
from app.domain.accounts.models import User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, Message, MessageRole
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies import turn_rows
from app.streaming.events import Status
from app.streaming.ledger import Progress
from tests.db.chat_rows import (
    Sessions,
    add_turn,
    finish_reply,
    flush,
    ledger,
    message_count,
    outcome,
    reload,
)

FINAL_STATUSES = [status for status in Status if status.is_final]


def test_every_status_but_streaming_is_final() -> None:
    assert set(FINAL_STATUSES) == set(Status) - {Status.STREAMING}
    assert Status.CANCELLED.is_final and not Status.STREAMING.is_final


async def test_add_turn_creates_the_question_and_a_streaming_reply(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    user_message, reply = await add_turn(
        db_sessions, conversation.id, "What is 2+2?", "smollm2", engine_request_id="req-1"
    )
    stored_user = await reload(db_sessions, user_message.id)
    stored_reply = await reload(db_sessions, reply.id)
    assert (stored_user.role, stored_user.status, stored_user.content) == (
        MessageRole.USER,
        Status.COMPLETED,
        "What is 2+2?",
    )
    assert (stored_reply.role, stored_reply.status, stored_reply.content) == (
        MessageRole.ASSISTANT,
        Status.STREAMING,
        "",
    )
    assert stored_reply.model == "smollm2" and stored_reply.engine_request_id == "req-1"
    assert stored_user.created_at < stored_reply.created_at
    refreshed = await conversations.get_conversation(
        db_sessions, conversation.user_id, conversation.id
    )
    assert refreshed is not None and refreshed.updated_at >= stored_user.created_at


async def test_add_turn_names_an_untitled_conversation_once(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The first message titles a "New chat"; later ones (and a chosen title) are left alone."""
    owner = conversation.user_id
    await conversations.rename_conversation(
        db_sessions, owner, conversation.id, conversations.DEFAULT_TITLE
    )
    await add_turn(db_sessions, conversation.id, "q", "m", title_if_untitled="First  question")
    await add_turn(db_sessions, conversation.id, "q", "m", title_if_untitled="Second")
    named = await conversations.get_conversation(db_sessions, owner, conversation.id)
    assert named is not None and named.title == "First question"


async def test_write_turn_tells_the_title_it_named_the_chat_with(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """What the send publishes as the chat's rename: the distinct title, once."""
    owner = conversation.user_id
    for title in (conversations.DEFAULT_TITLE, "First question"):  # one chat has the name taken
        taken = await conversations.create_conversation(db_sessions, owner, title)
    await conversations.rename_conversation(
        db_sessions, owner, conversation.id, conversations.DEFAULT_TITLE
    )
    named = []
    for content in ("First  question", "Second"):
        async with transaction(db_sessions) as session:
            turn = await turn_rows.write_turn(
                session, conversation.id, content, "m", parent_id=None, title_if_untitled=content
            )
        named.append(turn.title)
    assert named == ["First question (2)", None]
    assert taken.title == "First question"


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
            await add_turn(db_sessions, conversation.id, "hello?", "m")
    finally:
        event.remove(db_engine.sync_engine, "after_cursor_execute", fail_after_message_insert)

    assert await message_count(db_sessions, conversation.id) == 0
    unchanged = await conversations.get_conversation(
        db_sessions, conversation.user_id, conversation.id
    )
    assert unchanged is not None and unchanged.updated_at == conversation.updated_at


async def test_add_turn_to_a_missing_conversation(db_sessions: Sessions, owner: User) -> None:
    with pytest.raises(conversations.ConversationNotFoundError):
        await add_turn(db_sessions, uuid.uuid4(), "hi", "m")
    assert await message_count(db_sessions) == 0


async def test_write_turn_with_a_known_parent_is_three_statements(
    db_sessions: Sessions, db_engine: AsyncEngine, conversation: Conversation
) -> None:
    """A send's writes: the conversation's UPDATE (bump and leaf), both rows in one INSERT, and
    nothing read back; the question follows the parent given, None meaning a first question."""
    first_q, first_r = await add_turn(db_sessions, conversation.id, "one", "m")
    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement.split()[0].upper())

    event.listen(db_engine.sync_engine, "before_cursor_execute", count)
    try:
        async with transaction(db_sessions) as session:
            root_q, root_r, _ = await turn_rows.write_turn(
                session, conversation.id, "one, again", "m", parent_id=None
            )
    finally:
        event.remove(db_engine.sync_engine, "before_cursor_execute", count)

    assert statements == ["UPDATE", "INSERT"]
    assert (await reload(db_sessions, root_q.id)).parent_id is None  # a sibling of `first_q`
    assert (await reload(db_sessions, root_r.id)).parent_id == root_q.id
    shown = await conversations.get_conversation(db_sessions, conversation.user_id, conversation.id)
    assert shown is not None and shown.current_leaf_id == root_r.id != first_r.id
    assert first_q.parent_id is None


async def test_write_api_call_makes_its_conversation_and_turn_at_once(
    db_sessions: Sessions, owner: User
) -> None:
    question = "  \n" * 50 + "What is the capital of France?"  # a blank start: named from it
    async with transaction(db_sessions) as session:
        asked, reply = await turn_rows.write_api_call(
            session, owner.id, question, "m", engine_request_id="req-9"
        )
    conversation = await conversations.get_conversation(
        db_sessions, owner.id, reply.conversation_id
    )
    assert conversation is not None
    assert (conversation.source, conversation.current_leaf_id) == ("api", reply.id)
    assert conversation.title == "What is the capital of France?"
    stored_q, stored_r = await reload(db_sessions, asked.id), await reload(db_sessions, reply.id)
    assert (stored_q.parent_id, stored_q.content, stored_q.role) == (None, question, "user")
    assert (stored_r.parent_id, stored_r.status, stored_r.engine_request_id) == (
        asked.id,
        Status.STREAMING,
        "req-9",
    )


async def test_progress_then_final(db_sessions: Sessions, conversation: Conversation) -> None:
    _, reply = await add_turn(
        db_sessions, conversation.id, "Tell me a story", "m", engine_request_id="req-9"
    )
    t0 = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

    await flush(db_sessions, reply.id, "Once", 1)
    await flush(db_sessions, reply.id, "Once upon", 2)
    flushed = await reload(db_sessions, reply.id)
    assert (flushed.content, flushed.completion_tokens) == ("Once upon", 2)
    assert flushed.status is Status.STREAMING and not flushed.is_final

    done = await finish_reply(
        db_sessions,
        reply.id,
        Status.COMPLETED,
        text="Once upon a time.",
        finish_reason="stop",
        prompt_tokens=12,
        completion_tokens=5,
        queued_at=t0.timestamp() - 0.5,
        first_token_at=t0.timestamp(),
        finished_at=t0.timestamp() + 2,
        ttft_ms=500.0,
        gap_p50_ms=20.0,
        gap_p99_ms=80.5,
    )
    assert done
    final = await reload(db_sessions, reply.id)
    assert final.status is Status.COMPLETED and final.is_final
    assert final.content == "Once upon a time."
    assert (final.finish_reason, final.prompt_tokens, final.completion_tokens) == ("stop", 12, 5)
    assert final.queued_at == t0 - timedelta(seconds=0.5)
    assert final.first_token_at == t0
    assert final.finished_at == t0 + timedelta(seconds=2)
    assert (final.ttft_ms, final.gap_p50_ms, final.gap_p99_ms) == (500.0, 20.0, 80.5)
    assert final.engine_request_id == "req-9" and final.error is None  # the end leaves it alone

    # A flush that lost the race against the finish changes nothing.
    await flush(db_sessions, reply.id, "Once upon a", 3)
    assert (await reload(db_sessions, reply.id)).content == "Once upon a time."


async def test_the_row_keeps_the_outcome_as_it_is(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """Every field of the streaming core's Outcome is written and read back unchanged: the row is
    the reply's one record (a field missed on either side shows here)."""
    _, reply = await add_turn(db_sessions, conversation.id, "Go", "m")
    t0 = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC).timestamp()
    ended = outcome(
        reply.id,
        Status.CANCELLED,
        finish_reason="cancelled",
        text="Once upon",
        prompt_tokens=12,
        completion_tokens=7,
        queued_at=t0,
        first_token_at=t0 + 0.25,
        finished_at=t0 + 2,
        ttft_ms=250.0,
        gap_p50_ms=20.0,
        gap_p99_ms=80.5,
        cancel_token_index=5,
        tokens_after_cancel=2,
        error="stopped by the user",
        stopped_by="admin",
    )
    assert None not in dataclasses.astuple(ended)  # every field says something

    await ledger(db_sessions).save_finals([ended])
    assert reply_rows.stored_outcome(await reload(db_sessions, reply.id)) == ended


async def test_a_row_without_its_end_reads_as_an_empty_outcome(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """A reply the server never finished (here: marked interrupted at startup) has no counts or
    times: they read as zero, so its final event adds up (total 0 ms)."""
    _, reply = await add_turn(db_sessions, conversation.id, "Go", "m")
    await flush(db_sessions, reply.id, "half", 2)
    await reply_rows.mark_interrupted_at_startup(db_sessions)
    stored = reply_rows.stored_outcome(await reload(db_sessions, reply.id))
    assert (stored.status, stored.text, stored.completion_tokens) == (Status.INTERRUPTED, "half", 2)
    assert (stored.prompt_tokens, stored.queued_at, stored.finished_at) == (0, 0.0, 0.0)
    assert stored.first_token_at is None and stored.ttft_ms is None


async def test_the_ledger_saves_several_ends_all_or_none(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, first = await add_turn(db_sessions, conversation.id, "a", "m")
    _, second = await add_turn(db_sessions, conversation.id, "b", "m")
    saving = ledger(db_sessions)
    with pytest.raises(ValueError, match="not a final status"):
        await saving.save_finals(
            [outcome(first.id, Status.COMPLETED, text="one"), outcome(second.id, Status.STREAMING)]
        )
    assert (await reload(db_sessions, first.id)).status is Status.STREAMING

    await saving.save_finals(
        [outcome(first.id, Status.COMPLETED, text="one"), outcome(second.id, Status.LENGTH)]
    )
    assert (await reload(db_sessions, first.id)).content == "one"
    assert (await reload(db_sessions, second.id)).status is Status.LENGTH


async def test_final_status_is_never_overwritten(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await add_turn(db_sessions, conversation.id, "Go", "m")
    await flush(db_sessions, reply.id, "partial", 7)
    assert await finish_reply(
        db_sessions,
        reply.id,
        "cancelled",
        text="partial",
        finish_reason="cancelled",
        cancel_token_index=7,
        tokens_after_cancel=1,
    )
    for status in FINAL_STATUSES:
        assert not await finish_reply(db_sessions, reply.id, status, text="other", error="late")
    final = await reload(db_sessions, reply.id)
    assert final.status is Status.CANCELLED
    assert final.content == "partial"
    assert (final.cancel_token_index, final.tokens_after_cancel) == (7, 1)
    assert final.error is None and final.finished_at is not None

    with pytest.raises(ValueError, match="not a final status"):
        await finish_reply(db_sessions, reply.id, Status.STREAMING)


async def test_concurrent_finishes_have_one_winner(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await add_turn(db_sessions, conversation.id, "Go", "m")
    statuses = [Status.COMPLETED, Status.CANCELLED, Status.DISCONNECTED] * 3
    results = await asyncio.gather(
        *(finish_reply(db_sessions, reply.id, s, text=str(s)) for s in statuses)
    )
    assert sum(results) == 1
    winner = statuses[results.index(True)]
    final = await reload(db_sessions, reply.id)
    assert final.status is winner and final.content == str(winner)


async def test_finish_does_not_touch_user_messages(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    question, _ = await add_turn(db_sessions, conversation.id, "Q", "m")
    assert not await finish_reply(db_sessions, question.id, "failed", error="x")
    assert (await reload(db_sessions, question.id)).status is Status.COMPLETED


async def test_failed_reply_keeps_its_error(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, reply = await add_turn(db_sessions, conversation.id, "Q", "m")
    assert await finish_reply(
        db_sessions, reply.id, "failed", finish_reason="error", error="engine crashed"
    )
    final = await reload(db_sessions, reply.id)
    assert (final.status, final.error, final.content) == (Status.FAILED, "engine crashed", "")


async def test_mark_interrupted_at_startup(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, left_streaming = await add_turn(db_sessions, conversation.id, "one", "m")
    await flush(db_sessions, left_streaming.id, "half a repl", 4)
    _, also_streaming = await add_turn(db_sessions, conversation.id, "two", "m")
    _, finished = await add_turn(db_sessions, conversation.id, "three", "m")
    await finish_reply(db_sessions, finished.id, "length", text="full")

    assert await reply_rows.mark_interrupted_at_startup(db_sessions) == 2
    interrupted = await reload(db_sessions, left_streaming.id)
    assert interrupted.status is Status.INTERRUPTED
    assert interrupted.content == "half a repl" and interrupted.error
    assert (await reload(db_sessions, also_streaming.id)).status is Status.INTERRUPTED
    assert (await reload(db_sessions, finished.id)).status is Status.LENGTH

    assert await reply_rows.mark_interrupted_at_startup(db_sessions) == 0
    assert not await finish_reply(db_sessions, left_streaming.id, "completed")


async def test_many_replies_flushing_at_once(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """What the streaming core does every second: concurrent flushes must not hit 'locked'."""
    replies = [(await add_turn(db_sessions, conversation.id, f"q{i}", "m"))[1] for i in range(12)]

    async def stream(reply: Message) -> None:
        for n in range(1, 6):
            await flush(db_sessions, reply.id, "x" * n, n)
        flushed = await reload(db_sessions, reply.id)
        assert (flushed.content, flushed.completion_tokens) == ("xxxxx", 5)
        assert await finish_reply(db_sessions, reply.id, "completed", text="done")

    await asyncio.gather(*(stream(reply) for reply in replies))
    for reply in replies:
        final = await reload(db_sessions, reply.id)
        assert (final.status, final.content) == (Status.COMPLETED, "done")


async def test_progress_updates_batch_in_one_transaction(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """The ledger flushes every running reply at once; a finished one is left alone."""
    _, running = await add_turn(db_sessions, conversation.id, "a", "m")
    _, finished = await add_turn(db_sessions, conversation.id, "b", "m")
    await finish_reply(db_sessions, finished.id, "completed", text="final")

    await ledger(db_sessions).save_progress(
        [Progress(str(running.id), "partial", 3), Progress(str(finished.id), "stale", 9)]
    )
    flushed = await reload(db_sessions, running.id)
    assert (flushed.content, flushed.completion_tokens, flushed.status) == (
        "partial",
        3,
        Status.STREAMING,
    )
    assert (await reload(db_sessions, finished.id)).content == "final"


async def test_get_message_unscoped(db_sessions: Sessions, conversation: Conversation) -> None:
    _, reply = await add_turn(db_sessions, conversation.id, "a", "m")
    found = await reply_rows.get_message_unscoped(db_sessions, reply.id)
    assert found is not None and found.id == reply.id
    assert await reply_rows.get_message_unscoped(db_sessions, uuid.uuid4()) is None
