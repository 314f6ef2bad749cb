"""Pinned and archived conversations on real SQLite and PostgreSQL (issue 22, item 8): the list
puts the pinned first (newest pin first) and leaves the archived out, its keyed pages neither lose
nor repeat one across the pinned/unpinned boundary, the archived ones page the same way, and a new
turn brings an archived conversation back."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest

from app.domain.accounts.models import User
from app.domain.chat import conversations
from app.domain.chat.conversations import ListKey
from app.domain.chat.models import Conversation
from tests.db.chat_rows import Sessions, add_turn

MakeUser = Callable[..., Awaitable[User]]


async def _make(sessions: Sessions, owner: User, n: int) -> list[Conversation]:
    """`n` conversations, oldest first (each one's `updated_at` later than the one before)."""
    return [
        await conversations.create_conversation(sessions, owner.id, f"Chat {i:02}")
        for i in range(n)
    ]


async def _ids(sessions: Sessions, owner: User, **kwargs: object) -> list[uuid.UUID]:
    listed = await conversations.list_conversations(sessions, owner.id, limit=500, **kwargs)  # type: ignore[arg-type]
    return [c.id for c in listed]


async def _walk(sessions: Sessions, owner: User, limit: int, *, archived: bool = False) -> list:
    """Every page, as the sidebar asks for them: keyed by the last one listed."""
    pages: list[list[Conversation]] = []
    key = None
    while True:
        page = await conversations.list_conversations(
            sessions, owner.id, limit=limit, after=key, archived=archived
        )
        pages.append(page)
        if len(page) < limit:
            return [c.id for p in pages for c in p]
        last = page[-1]
        key = ListKey(last.updated_at, last.id, last.pinned_at)


async def test_pinned_first_newest_pin_first_and_archived_left_out(
    db_sessions: Sessions, owner: User
) -> None:
    chats = await _make(db_sessions, owner, 6)
    first_pin = await conversations.file_conversation(
        db_sessions, owner.id, chats[1].id, pinned=True
    )
    await conversations.file_conversation(db_sessions, owner.id, chats[3].id, pinned=True)
    archived = await conversations.file_conversation(
        db_sessions, owner.id, chats[4].id, archived=True
    )
    assert first_pin is not None and first_pin.pinned_at is not None
    assert archived is not None and archived.archived_at is not None
    assert archived.updated_at == chats[4].updated_at  # filing is not activity

    expected = [chats[3].id, chats[1].id, chats[5].id, chats[2].id, chats[0].id]
    assert await _ids(db_sessions, owner) == expected
    assert await _ids(db_sessions, owner, archived=True) == [chats[4].id]

    # Pinning again keeps its place; unpinning puts it back among the others by its activity.
    again = await conversations.file_conversation(db_sessions, owner.id, chats[1].id, pinned=True)
    assert again is not None and again.pinned_at == first_pin.pinned_at
    await conversations.file_conversation(db_sessions, owner.id, chats[3].id, pinned=False)
    assert await _ids(db_sessions, owner) == [
        chats[1].id,
        chats[5].id,
        chats[3].id,
        chats[2].id,
        chats[0].id,
    ]

    # Archiving a pinned one unpins it; pinning an archived one brings it back, on top.
    moved = await conversations.file_conversation(db_sessions, owner.id, chats[1].id, archived=True)
    assert moved is not None and moved.pinned_at is None and moved.archived_at is not None
    back = await conversations.file_conversation(db_sessions, owner.id, chats[4].id, pinned=True)
    assert back is not None and back.archived_at is None and back.pinned_at is not None
    assert (await _ids(db_sessions, owner))[0] == chats[4].id
    assert await _ids(db_sessions, owner, archived=True) == [chats[1].id]
    unarchived = await conversations.file_conversation(
        db_sessions, owner.id, chats[1].id, archived=False
    )
    assert unarchived is not None and unarchived.archived_at is None
    assert await _ids(db_sessions, owner, archived=True) == []

    with pytest.raises(conversations.PinnedAndArchivedError):
        await conversations.file_conversation(
            db_sessions, owner.id, chats[0].id, pinned=True, archived=True
        )


@pytest.mark.parametrize("limit", [1, 3, 7, 8, 50])
async def test_pages_cross_the_pinned_boundary_losing_and_repeating_none(
    db_sessions: Sessions, owner: User, limit: int
) -> None:
    """Seven pinned of 23: pages of 7 end exactly at the boundary, of 3 and 8 inside it."""
    chats = await _make(db_sessions, owner, 23)
    for chat in (chats[5], chats[0], chats[17], chats[9], chats[22], chats[2], chats[11]):
        await conversations.file_conversation(db_sessions, owner.id, chat.id, pinned=True)
    for chat in (chats[4], chats[12], chats[20]):
        await conversations.file_conversation(db_sessions, owner.id, chat.id, archived=True)
    everything = await _ids(db_sessions, owner)
    assert len(everything) == 20
    assert everything[:7] == [c.id for c in (chats[11], chats[2], chats[22], chats[9])] + [
        chats[17].id,
        chats[0].id,
        chats[5].id,
    ]
    assert await _walk(db_sessions, owner, limit) == everything
    assert await _walk(db_sessions, owner, limit, archived=True) == [
        chats[20].id,
        chats[12].id,
        chats[4].id,
    ]


async def test_a_page_keyed_by_a_pin_undone_meanwhile_still_reaches_the_rest(
    db_sessions: Sessions, owner: User
) -> None:
    chats = await _make(db_sessions, owner, 5)
    for chat in (chats[0], chats[1]):
        await conversations.file_conversation(db_sessions, owner.id, chat.id, pinned=True)
    first = await conversations.list_conversations(db_sessions, owner.id, limit=1)
    assert [c.id for c in first] == [chats[1].id]
    await conversations.file_conversation(db_sessions, owner.id, chats[1].id, pinned=False)
    last = first[0]
    rest = await conversations.list_conversations(
        db_sessions, owner.id, limit=10, after=ListKey(last.updated_at, last.id, last.pinned_at)
    )
    # chats[1] is unpinned now: listed again among the others (the page dedupes it), none lost.
    assert [c.id for c in rest] == [chats[0].id, chats[4].id, chats[3].id, chats[2].id, chats[1].id]


async def test_a_new_turn_brings_an_archived_conversation_back_on_top(
    db_sessions: Sessions, owner: User
) -> None:
    chats = await _make(db_sessions, owner, 3)
    await conversations.file_conversation(db_sessions, owner.id, chats[0].id, archived=True)
    assert chats[0].id not in await _ids(db_sessions, owner)
    await add_turn(db_sessions, chats[0].id, "still here?", "m")
    assert await _ids(db_sessions, owner) == [chats[0].id, chats[2].id, chats[1].id]
    assert await _ids(db_sessions, owner, archived=True) == []


async def test_only_the_owner_files_a_conversation(
    db_sessions: Sessions, owner: User, make_user: MakeUser
) -> None:
    (chat,) = await _make(db_sessions, owner, 1)
    stranger = await make_user("stranger@example.com")
    assert (
        await conversations.file_conversation(db_sessions, stranger.id, chat.id, archived=True)
        is None
    )
    assert await _ids(db_sessions, owner) == [chat.id]
    assert await _ids(db_sessions, stranger, archived=True) == []
