"""Migration 0005 on real SQLite and PostgreSQL: conversations written before it (regenerated
replies marked `replaced_at`) become trees with nothing lost, and the downgrade gives back the very
same rows; a tree made after it goes back to one line, the versions not shown marked replaced."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine, make_sessionmaker
from app.db.migrate import (
    current_revision,
    downgrade_database_async,
    head_revision,
    upgrade_database_async,
)
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from tests.db.chat_rows import add_turn, branch_prompt, finish_reply, reload, shown_messages

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

users = sa.table(
    "users",
    sa.column("id", GUID(length=16)),
    sa.column("email", sa.String),
    sa.column("password_hash", sa.String),
    sa.column("is_admin", sa.Boolean),
    sa.column("created_at", DateTimeUTC(timezone=True)),
)
conversations_0004 = sa.table(
    "conversations",
    sa.column("id", GUID(length=16)),
    sa.column("user_id", GUID(length=16)),
    sa.column("title", sa.String),
    sa.column("source", sa.String),
    sa.column("created_at", DateTimeUTC(timezone=True)),
    sa.column("updated_at", DateTimeUTC(timezone=True)),
)
messages_0004 = sa.table(
    "messages",
    sa.column("id", GUID(length=16)),
    sa.column("conversation_id", GUID(length=16)),
    sa.column("role", sa.String),
    sa.column("content", sa.Text),
    sa.column("status", sa.String),
    sa.column("created_at", DateTimeUTC(timezone=True)),
    sa.column("replaced_at", DateTimeUTC(timezone=True)),
)


async def _run(url: str, statement: Any, rows: list[dict[str, Any]] | None = None) -> list[Any]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            result = await connection.execute(statement, rows) if rows else None
            if result is None:
                result = await connection.execute(statement)
            return list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()


def _message(conversation: uuid.UUID, role: str, content: str, at: int, **extra: Any) -> dict:
    return {
        "id": uuid.uuid4(),
        "conversation_id": conversation,
        "role": role,
        "content": content,
        "status": "completed",
        "created_at": T0 + timedelta(seconds=at),
        "replaced_at": None,
        **extra,
    }


async def _snapshot(url: str) -> set[tuple[Any, ...]]:
    return set(await _run(url, sa.select(messages_0004)))


async def test_replaced_replies_become_versions_and_come_back(database_url: str) -> None:
    await upgrade_database_async(database_url, "0004")
    user, chat, streaming, empty = (uuid.uuid4() for _ in range(4))
    await _run(
        database_url,
        sa.insert(users),
        [{"id": user, "email": "u@example.com", "password_hash": "x", "is_admin": False,
          "created_at": T0}],
    )  # fmt: skip
    await _run(
        database_url,
        sa.insert(conversations_0004),
        [
            {"id": c, "user_id": user, "title": c.hex, "source": "page", "created_at": T0,
             "updated_at": T0}
            for c in (chat, streaming, empty)
        ],
    )  # fmt: skip
    # Regenerated twice: the question, two replaced replies, the one shown; then a second turn.
    q1 = _message(chat, "user", "first", 0)
    r1a = _message(chat, "assistant", "one (a)", 1, replaced_at=T0 + timedelta(seconds=2))
    r1b = _message(chat, "assistant", "one (b)", 2, replaced_at=T0 + timedelta(seconds=3))
    r1c = _message(chat, "assistant", "one (c)", 3)
    q2 = _message(chat, "user", "second", 4)
    r2 = _message(chat, "assistant", "two", 5, status="cancelled")
    sq = _message(streaming, "user", "still going?", 0)
    sr = _message(streaming, "assistant", "", 1, status="streaming")
    await _run(database_url, sa.insert(messages_0004), [q1, r1a, r1b, r1c, q2, r2, sq, sr])
    before = await _snapshot(database_url)

    await upgrade_database_async(database_url)  # through 0005, to the revisions after it
    assert await current_revision(database_url) == head_revision()
    engine = create_engine(database_url, poolclass=NullPool)
    sessions = make_sessionmaker(engine)
    try:
        thread = await branches.visible_thread(sessions, user, chat)
        assert [m.id for m in thread.messages] == [q1["id"], r1c["id"], q2["id"], r2["id"]]
        assert thread.sibling_ids(thread.messages[1]) == [str(r1a["id"]), str(r1b["id"]), str(r1c["id"])]  # fmt: skip
        assert thread.conversation.current_leaf_id == r2["id"]
        assert (await reload(sessions, q2["id"])).parent_id == r1c["id"]
        assert (await reload(sessions, r1a["id"])).parent_id == q1["id"]
        assert (await branch_prompt(sessions, chat)) == (
            [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "one (c)"},
                {"role": "user", "content": "second"},
                {"role": "assistant", "content": "two"},
            ],
            r2["id"],
        )
        assert [m.id for m in (await branches.visible_thread(sessions, user, streaming)).messages] == [sq["id"], sr["id"]]  # fmt: skip
        assert (await branches.visible_thread(sessions, user, empty)).messages == []
        # A replaced reply is a version the user can show again.
        await branches.switch_branch(sessions, user, chat, r1a["id"])
        assert [m.content for m in await shown_messages(sessions, user, chat) or []] == ["first", "one (a)"]  # fmt: skip
        await branches.switch_branch(sessions, user, chat, r2["id"])

        # A tree made after the upgrade: an edited question, shown; the original one is not.
        tree = await conversations.create_conversation(sessions, user, "tree")
        original, reply = await _turn(sessions, tree.id, "question")
        edited, edited_reply = await branches.add_edited_turn(sessions, original, "edited", "m")
        await finish_reply(sessions, edited_reply.id, "completed", text="answer to the edit")
    finally:
        await engine.dispose()

    await downgrade_database_async(database_url, "0004")
    after = await _snapshot(database_url)
    old_rows = {row for row in after if row.conversation_id != tree.id}
    assert old_rows == before  # the very same rows, replaced_at included
    replaced = {row.id: row.replaced_at for row in after if row.conversation_id == tree.id}
    assert replaced == {
        original.id: edited.created_at,  # marked replaced when the edit took its place
        reply.id: edited.created_at,
        edited.id: None,
        edited_reply.id: None,
    }
    await upgrade_database_async(database_url)  # and up again, from the downgraded rows
    assert await current_revision(database_url) == head_revision()


async def _turn(sessions: Any, conversation_id: uuid.UUID, question: str) -> tuple[Any, Any]:
    q, r = await add_turn(sessions, conversation_id, question, "m")
    await finish_reply(sessions, r.id, "completed", text="answer")
    return q, r
