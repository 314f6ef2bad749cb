"""Writes that race each other, on real SQLite and PostgreSQL (issue 22, item 7): the first
ratings and settings of a row, saved many times at once, all land (the upserts of
app/db/upsert.py); a database that stays locked is `DatabaseBusyError`, a 503 with Retry-After
(app/db/session.py, app/domain/refusals.py), not a 500."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url

from app.db.session import DatabaseBusyError, transaction
from app.domain.accounts.models import User
from app.domain.chat.keep import ratings
from app.domain.chat.models import Conversation, Rating, ReplyRating
from app.domain.chat.settings import service as chat_settings
from app.domain.chat.settings.schemas import ChatSettings
from app.domain.refusals import refusal_for
from app.streaming.events import Status
from tests.db.chat_rows import Sessions, add_turn, finish_reply

AT_ONCE = 30


async def test_ratings_at_once_leave_one_row_holding_one_of_them(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    _, reply = await add_turn(db_sessions, conversation.id, "q", "m")
    await finish_reply(db_sessions, reply.id, Status.COMPLETED, text="a")
    comments = [f"comment {n}" for n in range(AT_ONCE)]
    rated = await asyncio.gather(
        *(
            ratings.rate_reply(db_sessions, owner.id, reply.id, Rating.UP, comment)
            for comment in comments
        )
    )
    assert sorted(row.comment for row in rated) == sorted(comments)  # each saw its own write
    async with transaction(db_sessions) as session:
        rows = list(await session.scalars(select(ReplyRating)))
    assert len(rows) == 1 and rows[0].comment in comments

    later = await ratings.rate_reply(db_sessions, owner.id, reply.id, Rating.DOWN, "last")
    assert (later.rating, later.comment) == (Rating.DOWN, "last")
    listed = await ratings.conversation_ratings(db_sessions, owner.id, conversation.id)
    assert [(r.rating, r.comment) for r in listed or []] == [(Rating.DOWN, "last")]


async def test_settings_saved_at_once_keep_one_of_them(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    prompts = [f"prompt {n}" for n in range(AT_ONCE)]
    await asyncio.gather(
        *(
            chat_settings.save_user_defaults(db_sessions, owner.id, ChatSettings(system_prompt=p))
            for p in prompts
        ),
        *(
            chat_settings.save_for_conversation(
                db_sessions, owner.id, conversation.id, ChatSettings(system_prompt=p, top_k=3)
            )
            for p in prompts
        ),
    )
    assert (await chat_settings.user_defaults(db_sessions, owner.id)).system_prompt in prompts
    saved = await chat_settings.for_conversation(db_sessions, conversation.id)
    assert saved.system_prompt in prompts and saved.top_k == 3

    last = ChatSettings(system_prompt="last", temperature=0.5)
    await chat_settings.save_for_conversation(db_sessions, owner.id, conversation.id, last)
    assert await chat_settings.for_conversation(db_sessions, conversation.id) == last


async def test_a_database_that_stays_locked_is_busy_not_a_bug(
    db_sessions: Sessions,
    database_backend: str,
    migrated_database_url: str,
    conversation: Conversation,
) -> None:
    rename = update(Conversation).where(Conversation.id == conversation.id).values(title="x")
    if database_backend == "sqlite":
        # Another process's writer holds SQLite's write lock; ours gives up after 50 ms.
        holder = sqlite3.connect(make_url(migrated_database_url).database or "")
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseBusyError) as caught:
                async with transaction(db_sessions) as session:
                    await session.execute(text("PRAGMA busy_timeout=50"))
                    await session.execute(rename)
        finally:
            holder.rollback()
            holder.close()
    else:
        # Another transaction holds the row's lock; ours waits 50 ms for it (lock_timeout).
        async with transaction(db_sessions) as holder:
            await holder.execute(
                select(Conversation.id).where(Conversation.id == conversation.id).with_for_update()
            )
            with pytest.raises(DatabaseBusyError) as caught:
                async with transaction(db_sessions) as session:
                    await session.execute(text("SET LOCAL lock_timeout = '50ms'"))
                    await session.execute(rename)
    refusal = refusal_for(caught.value)
    assert refusal is not None and refusal.status == 503
    assert refusal.headers == {"Retry-After": "1"}
    # Not every database error is "busy": a broken statement stays a bug.
    with pytest.raises(Exception) as bug:
        async with transaction(db_sessions) as session:
            await session.execute(text("SELECT * FROM no_such_table"))
    assert not isinstance(bug.value, DatabaseBusyError)
