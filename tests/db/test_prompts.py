"""What the model is shown, on real SQLite and PostgreSQL: the history, and a regeneration's."""

from __future__ import annotations

import pytest

from app.domain.chat import conversations, prompts, reply_rows
from app.domain.chat.models import Conversation
from app.streaming.events import Status
from tests.db.chat_rows import Sessions, finish_reply, message_count, reload


async def test_conversation_history_for_the_prompt(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await reply_rows.add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="answer one")
    _, r2 = await reply_rows.add_turn(db_sessions, conversation.id, "second", "m")
    await finish_reply(db_sessions, r2.id, "cancelled", text="cut sh")
    _, r3 = await reply_rows.add_turn(db_sessions, conversation.id, "third", "m")
    await finish_reply(db_sessions, r3.id, "failed", error="boom")  # no text: left out
    await reply_rows.add_turn(db_sessions, conversation.id, "fourth", "m")  # still streaming

    assert await prompts.conversation_history(db_sessions, conversation.id) == [
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
    _, r1 = await reply_rows.add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="answer one")
    q2, r2 = await reply_rows.add_turn(db_sessions, conversation.id, "second", "m")
    await finish_reply(db_sessions, r2.id, "completed", text="answer two")
    r2 = await reload(db_sessions, r2.id)

    history, question = await prompts.regeneration_prompt(db_sessions, r2)
    assert question == q2.id
    assert history == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"},
    ]
    new = await reply_rows.replace_reply(db_sessions, r2, "m", engine_request_id="req")
    assert new.status is Status.STREAMING and new.created_at > r2.created_at
    assert (await reload(db_sessions, r2.id)).replaced_at is not None
    await finish_reply(db_sessions, new.id, "completed", text="answer two, again")

    listed = await conversations.list_messages(db_sessions, conversation.user_id, conversation.id)
    assert listed is not None
    assert [m.content for m in listed] == ["first", "answer one", "second", "answer two, again"]
    assert (await prompts.conversation_history(db_sessions, conversation.id))[-1] == {
        "role": "assistant",
        "content": "answer two, again",
    }


async def test_only_the_latest_finished_reply_can_be_regenerated(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    _, r1 = await reply_rows.add_turn(db_sessions, conversation.id, "first", "m")
    await finish_reply(db_sessions, r1.id, "completed", text="one")
    _, r2 = await reply_rows.add_turn(db_sessions, conversation.id, "second", "m")  # streaming
    r1 = await reload(db_sessions, r1.id)
    with pytest.raises(reply_rows.NotRegenerableError, match="streaming"):
        await prompts.regeneration_prompt(db_sessions, r2)
    with pytest.raises(reply_rows.NotRegenerableError, match="latest"):
        await prompts.regeneration_prompt(db_sessions, r1)
    with pytest.raises(reply_rows.NotRegenerableError, match="latest"):
        await reply_rows.replace_reply(db_sessions, r1, "m")
    assert (await reload(db_sessions, r1.id)).replaced_at is None
    assert await message_count(db_sessions, conversation.id) == 4
