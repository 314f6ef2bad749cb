"""Edit and branch on real SQLite and PostgreSQL: the tree the turns make, the branch shown, and
the prompt that follows it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from app.domain.accounts.models import User
from app.domain.admin.queries import admin_list_messages
from app.domain.admin.tree_view import conversation_tree
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, ConversationSource, Message
from app.domain.chat.prompts import turns as prompts
from app.domain.chat.replies import rows as reply_rows
from tests.db.chat_rows import (
    Sessions,
    add_turn,
    branch_prompt,
    conversation_history,
    finish_reply,
    message_count,
    reload,
)


async def turn(sessions: Sessions, conversation: Conversation, question: str, answer: str):  # type: ignore[no-untyped-def]
    """One finished turn after the branch shown, as the reply service adds it."""
    _, parent = await branch_prompt(sessions, conversation.id)
    q, r = await add_turn(sessions, conversation.id, question, "m", parent_id=parent)
    await finish_reply(sessions, r.id, "completed", text=answer)
    return q, await reload(sessions, r.id)


async def shown(sessions: Sessions, conversation: Conversation) -> list[str]:
    thread = await branches.visible_thread(sessions, conversation.user_id, conversation.id)
    return [m.content for m in thread.messages]


async def test_turns_make_a_chain_ending_at_the_current_leaf(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    q1, r1 = await turn(db_sessions, conversation, "first", "one")
    q2, r2 = await turn(db_sessions, conversation, "second", "two")
    assert [q1.parent_id, r1.parent_id, q2.parent_id, r2.parent_id] == [None, q1.id, r1.id, q2.id]
    thread = await branches.visible_thread(db_sessions, conversation.user_id, conversation.id)
    assert thread.conversation.current_leaf_id == r2.id
    assert [m.id for m in thread.messages] == [q1.id, r1.id, q2.id, r2.id]
    assert [thread.sibling_ids(m) for m in thread.messages] == [
        [str(m.id)] for m in thread.messages
    ]


async def test_regenerate_adds_a_version_and_switching_moves_the_prompt(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """Two versions of a reply; the one shown is the one the next turn's prompt carries, and the
    next turn follows it; switching back shows the newest end of the other branch."""
    await turn(db_sessions, conversation, "first", "one")
    q2, old = await turn(db_sessions, conversation, "second", "two, short")
    new = await branches.add_sibling_reply(db_sessions, old, "m")
    await finish_reply(db_sessions, new.id, "completed", text="two, the long version")

    thread = await branches.visible_thread(db_sessions, conversation.user_id, conversation.id)
    assert thread.messages[-1].id == new.id
    assert thread.sibling_ids(thread.messages[-1]) == [str(old.id), str(new.id)]
    assert (await conversation_history(db_sessions, conversation.id))[-1]["content"] == (
        "two, the long version"
    )

    switched = await branches.switch_branch(
        db_sessions, conversation.user_id, conversation.id, old.id
    )
    assert [m.content for m in switched.messages] == ["first", "one", "second", "two, short"]
    history, parent = await branch_prompt(db_sessions, conversation.id)
    assert parent == old.id and history[-1]["content"] == "two, short"
    q3, _ = await turn(db_sessions, conversation, "third", "three")
    assert q3.parent_id == old.id
    assert await shown(db_sessions, conversation) == [
        *("first", "one", "second", "two, short", "third", "three")
    ]

    # Back to the long version: its branch has nothing after it; then to the short one again,
    # which shows that branch to its newest end (the third turn), not just the reply.
    await branches.switch_branch(db_sessions, conversation.user_id, conversation.id, new.id)
    assert await shown(db_sessions, conversation) == [
        *("first", "one", "second", "two, the long version")
    ]
    await branches.switch_branch(db_sessions, conversation.user_id, conversation.id, old.id)
    assert (await shown(db_sessions, conversation))[-1] == "three"
    assert q2.id == old.parent_id == new.parent_id


async def test_edit_adds_a_version_of_the_question_with_its_own_reply(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    q1, r1 = await turn(db_sessions, conversation, "first", "one")
    q2, r2 = await turn(db_sessions, conversation, "second", "two")
    await turn(db_sessions, conversation, "third", "three")

    assert await prompts.edit_prompt(db_sessions, q2, "second, edited") == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second, edited"},
    ]
    edited, reply = await branches.add_edited_turn(db_sessions, q2, "second, edited", "m")
    assert (edited.parent_id, reply.parent_id) == (r1.id, edited.id)
    await finish_reply(db_sessions, reply.id, "completed", text="two, again")
    thread = await branches.visible_thread(db_sessions, conversation.user_id, conversation.id)
    assert [m.content for m in thread.messages] == ["first", "one", "second, edited", "two, again"]
    assert thread.sibling_ids(thread.messages[2]) == [str(q2.id), str(edited.id)]
    assert thread.sibling_ids(thread.messages[3]) == [str(reply.id)]

    # The first question edited: a second root.
    root, _ = await branches.add_edited_turn(db_sessions, q1, "first, edited", "m")
    assert root.parent_id is None
    thread = await branches.visible_thread(db_sessions, conversation.user_id, conversation.id)
    assert thread.sibling_ids(thread.messages[0]) == [str(q1.id), str(root.id)]
    assert await conversation_history(db_sessions, conversation.id) == [
        {"role": "user", "content": "first, edited"}  # its reply still streams: left out
    ]
    # Back to the original first question: its newest branch, the edited second one.
    await branches.switch_branch(db_sessions, conversation.user_id, conversation.id, q1.id)
    assert await shown(db_sessions, conversation) == [
        "first",
        "one",
        "second, edited",
        "two, again",
    ]
    await branches.switch_branch(db_sessions, conversation.user_id, conversation.id, r2.id)
    assert await shown(db_sessions, conversation) == [
        *("first", "one", "second", "two", "third", "three")
    ]
    assert await message_count(db_sessions, conversation.id) == 10  # nothing was lost


async def test_switching_is_scoped_to_the_owner_and_the_conversation(
    db_sessions: Sessions,
    conversation: Conversation,
    owner: User,
    make_user,  # type: ignore[no-untyped-def]
) -> None:
    _, reply = await turn(db_sessions, conversation, "first", "one")
    other = await conversations.create_conversation(db_sessions, owner.id, "other")
    stranger = await make_user("stranger@example.com")
    with pytest.raises(conversations.ConversationNotFoundError):
        await branches.switch_branch(db_sessions, stranger.id, conversation.id, reply.id)
    with pytest.raises(conversations.ConversationNotFoundError):
        await branches.visible_thread(db_sessions, stranger.id, conversation.id)
    with pytest.raises(branches.UnknownBranchError):
        await branches.switch_branch(db_sessions, owner.id, other.id, reply.id)
    with pytest.raises(branches.UnknownBranchError):
        await branches.switch_branch(db_sessions, owner.id, conversation.id, uuid.uuid4())


async def test_api_conversations_have_no_versions(db_sessions: Sessions, owner: User) -> None:
    api = await conversations.create_conversation(
        db_sessions, owner.id, "api", ConversationSource.API
    )
    q, r = await add_turn(db_sessions, api.id, "hi", "m")
    await finish_reply(db_sessions, r.id, "completed", text="hello")
    with pytest.raises(branches.NotEditableError):
        await prompts.edit_prompt(db_sessions, q, "hi again")
    with pytest.raises(reply_rows.NotRegenerableError, match="chat page"):
        await prompts.regeneration_prompt(db_sessions, await reload(db_sessions, r.id))


async def test_concurrent_regenerations_each_add_a_version(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """Racing regenerations of one reply serialise on the conversation's row: each adds its
    version of the reply, all answer the same question, and the last one written is shown."""
    question, reply = await turn(db_sessions, conversation, "Go", "done")
    results = await asyncio.gather(
        *(branches.add_sibling_reply(db_sessions, reply, "m") for _ in range(6))
    )
    assert all(isinstance(r, Message) and r.parent_id == question.id for r in results)
    assert await message_count(db_sessions, conversation.id) == 8
    thread = await branches.visible_thread(db_sessions, conversation.user_id, conversation.id)
    assert len(thread.sibling_ids(thread.messages[-1])) == 7
    assert thread.messages[-1].id in {r.id for r in results}


async def test_a_deleted_conversation_takes_its_tree_with_it(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    q1, r1 = await turn(db_sessions, conversation, "first", "one")
    await branches.add_sibling_reply(db_sessions, r1, "m")
    await branches.add_edited_turn(db_sessions, q1, "again", "m")
    assert await conversations.delete_conversation(
        db_sessions, conversation.user_id, conversation.id
    )
    assert await message_count(db_sessions, conversation.id) == 0
    with pytest.raises(conversations.ConversationNotFoundError):
        await branches.add_edited_turn(db_sessions, q1, "too late", "m")


async def test_the_admin_sees_the_whole_tree(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    """A run of single versions, then one branch per version, the one shown marked."""
    await turn(db_sessions, conversation, "first", "one")
    _, old = await turn(db_sessions, conversation, "second", "two")
    new = await branches.add_sibling_reply(db_sessions, old, "m")
    rows = await admin_list_messages(db_sessions, conversation.id)
    stored = await conversations.get_conversation(
        db_sessions, conversation.user_id, conversation.id
    )
    assert stored is not None
    tree = conversation_tree(stored, rows)
    assert [(m["content"], m["shown"]) for m in tree["messages"]] == [
        ("first", True),
        ("one", True),
        ("second", True),
    ]
    forks = tree["forks"]
    assert [(f["index"], f["count"], f["shown"]) for f in forks] == [(1, 2, False), (2, 2, True)]
    assert [m["id"] for m in forks[0]["branch"]["messages"]] == [str(old.id)]
    assert [m["id"] for m in forks[1]["branch"]["messages"]] == [str(new.id)]
