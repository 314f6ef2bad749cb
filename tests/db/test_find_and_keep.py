"""Search, export/import and reply ratings on real SQLite and PostgreSQL (issue 11, items 4, 6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID, uuid4

import msgspec
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from app.db.migrate import (
    alembic_config,
    current_revision,
    downgrade_database_async,
    head_revision,
    upgrade_database_async,
)
from app.domain.accounts.models import User
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from app.domain.chat.keep import export, importing, ratings, search
from app.domain.chat.keep.schemas import ConversationExport
from app.domain.chat.models import Conversation, Rating
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies.service import NotFoundError
from app.streaming.events import Status
from tests.db.chat_rows import Sessions, add_turn, finish_reply, shown_messages
from tests.db.test_db_migrations import _inspect

MakeUser = Callable[..., Awaitable[User]]


async def _turn(
    sessions: Sessions, conversation: Conversation, question: str, answer: str, **fields: object
) -> tuple[str, str]:
    asked, reply = await add_turn(sessions, conversation.id, question, "m")
    await finish_reply(
        sessions, reply.id, fields.pop("status", Status.COMPLETED), text=answer, **fields
    )
    return str(asked.id), str(reply.id)


# -- search -------------------------------------------------------------------------------------


async def test_search_finds_titles_and_text_ignoring_case(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    await _turn(db_sessions, conversation, "Tell me about Zebras", "Zebras have STRIPES.")
    other = await conversations.create_conversation(db_sessions, owner.id, "Stripes and dots")

    hits = await search.search_conversations(db_sessions, owner.id, "stripes")
    assert {h.conversation.id for h in hits} == {conversation.id, other.id}
    by_id = {h.conversation.id: h for h in hits}
    assert by_id[other.id].message_id is None  # the title matched
    assert by_id[other.id].snippet == search.Snippet("", "Stripes", " and dots")
    in_text = by_id[conversation.id]
    assert in_text.message_id is not None
    assert in_text.snippet == search.Snippet("Zebras have ", "STRIPES", ".")

    hits = await search.search_conversations(db_sessions, owner.id, "ZEBRA")
    assert [h.conversation.id for h in hits] == [conversation.id]
    assert await search.search_conversations(db_sessions, owner.id, "giraffe") == []
    assert await search.search_conversations(db_sessions, owner.id, "   ") == []


async def test_search_never_matches_another_users_text(
    db_sessions: Sessions, owner: User, conversation: Conversation, make_user: MakeUser
) -> None:
    stranger = await make_user("stranger@example.com")
    theirs = await conversations.create_conversation(db_sessions, stranger.id, "secret plans")
    await _turn(db_sessions, theirs, "the launch code", "is 0000 secret")
    await _turn(db_sessions, conversation, "hello", "hi there")

    assert await search.search_conversations(db_sessions, owner.id, "secret") == []
    assert await search.search_conversations(db_sessions, owner.id, "launch") == []
    found = await search.search_conversations(db_sessions, stranger.id, "secret")
    assert [h.conversation.id for h in found] == [theirs.id]


@pytest.mark.parametrize("wildcard", ["%", "_", "/", "\\"])
async def test_search_treats_like_wildcards_as_text(
    db_sessions: Sessions, owner: User, conversation: Conversation, wildcard: str
) -> None:
    await _turn(db_sessions, conversation, "plain words", "nothing special")
    assert await search.search_conversations(db_sessions, owner.id, wildcard) == []
    assert await search.search_conversations(db_sessions, owner.id, f"plain{wildcard}") == []
    await _turn(db_sessions, conversation, f"100{wildcard} sure", "ok")
    hits = await search.search_conversations(db_sessions, owner.id, f"100{wildcard}")
    assert [h.snippet.match for h in hits] == [f"100{wildcard}"]


async def test_search_finds_every_version_and_opens_the_conversation(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    """A regenerated reply and an edited question are versions off the branch shown: still the
    user's text, still found (search.py says why); the hit names the conversation."""
    question_id, reply_id = await _turn(db_sessions, conversation, "q", "an obsolete answer")
    reply = await reply_rows.get_message_unscoped(db_sessions, UUID(reply_id))
    assert reply is not None
    successor = await branches.add_sibling_reply(db_sessions, reply, "m")
    await finish_reply(db_sessions, successor.id, Status.COMPLETED, text="a fresh answer")
    question = await reply_rows.get_message_unscoped(db_sessions, UUID(question_id))
    assert question is not None
    await branches.add_edited_turn(db_sessions, question, "a rewritten question", "m")

    shown = await shown_messages(db_sessions, owner.id, conversation.id)
    assert [m.content for m in shown or []] == ["a rewritten question", ""]
    for query, message_id in [("obsolete", reply_id), ("fresh", str(successor.id))]:
        hits = await search.search_conversations(db_sessions, owner.id, query)
        assert [(h.conversation.id, str(h.message_id)) for h in hits] == [
            (conversation.id, message_id)
        ]
    hits = await search.search_conversations(db_sessions, owner.id, "rewritten")
    assert [h.snippet.match for h in hits] == ["rewritten"]


def test_snippet_cuts_around_the_match() -> None:
    text = "a" * 100 + " needle " + "b" * 100
    cut = search.snippet(text, "NEEDLE", context=5)
    assert cut == search.Snippet("…aaaa ", "needle", " bbbb…")


# -- export and import --------------------------------------------------------------------------


async def _tree_conversation(sessions: Sessions, conversation: Conversation) -> dict[str, UUID]:
    """first -> one two; second -> (cut sh | longer answer, shown); and an edit of "second"
    ("second, edited" -> "edited answer") that is a switch away. Returns the ids by name."""
    await _turn(
        sessions,
        conversation,
        "first",
        "one two",
        ttft_ms=12.5,
        gap_p50_ms=3.0,
        prompt_tokens=7,
        completion_tokens=2,
        finish_reason="stop",
    )
    second, stopped = await _turn(
        sessions,
        conversation,
        "second",
        "cut sh",
        status=Status.CANCELLED,
        cancel_token_index=2,
        tokens_after_cancel=1,
    )
    asked = await reply_rows.get_message_unscoped(sessions, UUID(second))
    assert asked is not None
    edited, edited_reply = await branches.add_edited_turn(sessions, asked, "second, edited", "m")
    await finish_reply(sessions, edited_reply.id, Status.COMPLETED, text="edited answer")
    await branches.switch_branch(sessions, conversation.user_id, conversation.id, UUID(stopped))
    old = await reply_rows.get_message_unscoped(sessions, UUID(stopped))
    assert old is not None
    new = await branches.add_sibling_reply(sessions, old, "m")  # a regenerated reply
    await finish_reply(sessions, new.id, Status.LENGTH, text="longer answer")
    return {"second": UUID(second), "stopped": UUID(stopped), "edited": edited.id, "new": new.id}


def _shape(export_: ConversationExport) -> tuple[list[dict[str, object]], list[int | None], int]:
    """An export without its ids: each message's fields, the index of its parent, the leaf's
    index; equal for two exports of the same tree under different ids."""
    at = {m.id: i for i, m in enumerate(export_.messages)}
    fields = [
        {k: v for k, v in msgspec.structs.asdict(m).items() if k not in ("id", "parent_id")}
        for m in export_.messages
    ]
    parents = [at[m.parent_id] if m.parent_id else None for m in export_.messages]
    leaf = export_.conversation.current_leaf_id
    assert leaf is not None
    return fields, parents, at[leaf]


async def test_export_then_import_keeps_the_tree_statuses_and_timings(
    db_sessions: Sessions, owner: User, conversation: Conversation, make_user: MakeUser
) -> None:
    ids = await _tree_conversation(db_sessions, conversation)
    rows = await export.conversation_rows(db_sessions, conversation.id, owner.id)
    assert rows is not None
    exported = export.to_export(*rows)
    by_id = {m.id: m for m in exported.messages}
    assert [m.status for m in exported.messages] == [
        Status.COMPLETED,
        Status.COMPLETED,
        Status.COMPLETED,
        Status.CANCELLED,
        Status.COMPLETED,
        Status.COMPLETED,
        Status.LENGTH,
    ]
    assert by_id[ids["stopped"]].content == "cut sh"  # every version is in the file
    assert by_id[ids["new"]].parent_id == by_id[ids["stopped"]].parent_id == ids["second"]
    assert by_id[ids["edited"]].parent_id == by_id[ids["second"]].parent_id
    assert exported.conversation.current_leaf_id == ids["new"]
    assert msgspec.json.decode(export.render(*rows, "json").body)["version"] == 2

    importer = await make_user("importer@example.com")
    body = export.render(*rows, "json").body
    imported = await importing.import_conversation(
        db_sessions, importer.id, importing.decode_export(body)
    )
    assert imported.user_id == importer.id and imported.title == conversation.title
    again = await export.conversation_rows(db_sessions, imported.id, importer.id)
    assert again is not None
    reexported = export.to_export(*again)
    assert _shape(reexported) == _shape(exported)  # the same tree, leaf and rows
    assert not {m.id for m in reexported.messages} & set(by_id)  # under new ids
    # The importer sees it like any of their chats, its versions a switch away; the owner's copy
    # is untouched.
    shown = await shown_messages(db_sessions, importer.id, imported.id)
    assert [m.content for m in shown or []] == ["first", "one two", "second", "longer answer"]
    thread = await branches.visible_thread(db_sessions, importer.id, imported.id)
    assert len(thread.sibling_ids(thread.messages[2])) == 2  # "second" and its edit
    assert len(thread.sibling_ids(thread.messages[3])) == 2  # "cut sh" and "longer answer"
    assert await export.conversation_rows(db_sessions, imported.id, owner.id) is None

    markdown = export.to_markdown(*rows)
    assert "## You\n\nsecond" in markdown and "longer answer" in markdown
    assert "cut sh" not in markdown and "edited" not in markdown  # only the branch shown
    assert "_(stopped at the length limit)_" in markdown
    await branches.switch_branch(db_sessions, owner.id, conversation.id, ids["edited"])
    rows = await export.conversation_rows(db_sessions, conversation.id, owner.id)
    assert rows is not None
    markdown = export.to_markdown(*rows)
    assert "second, edited" in markdown and "edited answer" in markdown
    assert "longer answer" not in markdown


async def test_a_version_1_export_imports_as_a_tree(
    db_sessions: Sessions, owner: User, make_user: MakeUser
) -> None:
    """Files written before branches: one line, a regenerated reply marked `replaced_at`; it
    becomes a version of its turn, as migration 0005 did with the stored rows."""
    v1 = _valid_export()
    at = lambda s: f"2026-12-01T09:00:{s:02d}+00:00"  # noqa: E731
    v1["messages"] = [
        {"role": "user", "content": "q1", "status": "completed", "created_at": at(0)},
        {"role": "assistant", "content": "old", "status": "cancelled", "created_at": at(1),
         "replaced_at": at(2)},
        {"role": "assistant", "content": "a1", "status": "completed", "created_at": at(2)},
        {"role": "user", "content": "q2", "status": "completed", "created_at": at(3)},
        {"role": "assistant", "content": "a2", "status": "completed", "created_at": at(4)},
    ]  # fmt: skip
    decoded = importing.decode_export(msgspec.json.encode(v1))
    parent = {m.content: m.parent_id for m in decoded.messages}
    named = {m.id: m.content for m in decoded.messages}
    assert {k: named.get(v) if v else None for k, v in parent.items()} == {
        "q1": None,
        "old": "q1",
        "a1": "q1",
        "q2": "a1",
        "a2": "q2",
    }
    importer = await make_user("importer@example.com")
    imported = await importing.import_conversation(db_sessions, importer.id, decoded)
    thread = await branches.visible_thread(db_sessions, importer.id, imported.id)
    assert [m.content for m in thread.messages] == ["q1", "a1", "q2", "a2"]
    assert len(thread.sibling_ids(thread.messages[1])) == 2  # "old" is a version of "a1"


def test_a_version_1_export_ending_in_a_replaced_reply_still_imports() -> None:
    """Its last kept message is a question with a (replaced) reply after it: not a leaf, so the
    import shows the newest branch instead of refusing a file this server once wrote."""
    v1 = _valid_export()
    v1["messages"].append(
        {"role": "assistant", "content": "old", "status": "cancelled",
         "created_at": "2026-12-01T09:00:01+00:00", "replaced_at": "2026-12-01T09:00:02+00:00"}
    )  # fmt: skip
    decoded = importing.decode_export(msgspec.json.encode(v1))
    assert decoded.conversation.current_leaf_id is None
    assert [m.parent_id for m in decoded.messages] == [None, decoded.messages[0].id]


def _valid_tree_export() -> dict[str, Any]:
    """Version 2: a question, two versions of its reply, the second shown."""
    q, a, b = (str(uuid4()) for _ in range(3))
    message = lambda i, role, parent: {  # noqa: E731
        "id": i, "parent_id": parent, "role": role, "content": role, "status": "completed",
        "created_at": "2026-12-01T09:00:00+00:00",
    }  # fmt: skip
    return {
        **_valid_export(),
        "version": 2,
        "conversation": {**_valid_export()["conversation"], "current_leaf_id": b},  # type: ignore[dict-item]
        "messages": [message(q, "user", None), message(a, "assistant", q), message(b, "assistant", q)],
    }  # fmt: skip


def _set(export_: dict[str, Any], where: str, value: object) -> None:
    """`where`: "messages[i].field" or "conversation.field"; a value "@j" is message j's id."""
    if isinstance(value, str) and value.startswith("@"):
        value = export_["messages"][int(value[1:])]["id"]
    head, field = where.rsplit(".", 1)
    target = (
        export_["conversation"] if head == "conversation" else export_["messages"][int(head[9:-1])]
    )
    target[field] = value


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ([("messages[1].parent_id", str(uuid4()))], "messages\\[1\\].parent_id: no message"),
        ([("messages[2].id", "@1")], "messages\\[2\\].id: .* is already messages\\[1\\]'s"),
        ([("messages[0].parent_id", "@0")], "messages\\[0\\]: .* a cycle"),
        ([("messages[0].parent_id", "@2")], "messages\\[0\\]: .* a cycle"),
        ([("conversation.current_leaf_id", str(uuid4()))], "current_leaf_id: no message"),
        ([("conversation.current_leaf_id", "@0")], "current_leaf_id: messages follow it"),
        ([("messages[1].parent_id", "not-a-uuid")], "messages\\[1\\].parent_id"),
        ([("messages[1].replaced_at", None)], "unknown field `replaced_at`"),
    ],
)
def test_import_refuses_what_is_not_a_tree(changes: list[tuple[str, object]], says: str) -> None:
    good = _valid_tree_export()
    decoded = importing.decode_export(msgspec.json.encode(good))
    first = decoded.messages[0].id
    assert [m.parent_id for m in decoded.messages] == [None, first, first]
    for where, value in changes:
        _set(good, where, value)
    with pytest.raises(importing.ImportRefusedError, match=says):
        importing.decode_export(msgspec.json.encode(good))


async def test_an_import_without_a_leaf_shows_the_newest_branch(
    db_sessions: Sessions, owner: User
) -> None:
    tree = _valid_tree_export()
    tree["conversation"]["current_leaf_id"] = None
    tree["messages"][2]["created_at"] = "2026-12-01T09:00:01+00:00"  # the newer version
    decoded = importing.decode_export(msgspec.json.encode(tree))
    imported = await importing.import_conversation(db_sessions, owner.id, decoded)
    thread = await branches.visible_thread(db_sessions, owner.id, imported.id)
    assert [m.id for m in thread.messages][-1] == imported.current_leaf_id
    assert [m.created_at.second for m in thread.messages] == [0, 1]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a conversation export"),
        (b'{"format": "other", "version": 1}', "format"),
        (b'{"format": "streamchat.conversation", "version": 3}', "version"),
        (b'{"format": "streamchat.conversation"}', "version"),
    ],
)
def test_import_refuses_what_is_not_an_export(body: bytes, says: str) -> None:
    with pytest.raises(importing.ImportRefusedError, match=says):
        importing.decode_export(body)


def _valid_export() -> dict[str, Any]:
    return {
        "format": "streamchat.conversation",
        "version": 1,
        "exported_at": "2026-12-01T09:00:00+00:00",
        "conversation": {
            "title": "t",
            "source": "page",
            "created_at": "2026-12-01T09:00:00+00:00",
            "updated_at": "2026-12-01T09:00:00+00:00",
        },
        "messages": [
            {
                "role": "user",
                "content": "hi",
                "status": "completed",
                "created_at": "2026-12-01T09:00:00+00:00",
            },
        ],
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda e: e["messages"][0].update(extra=1), "unknown field `extra`"),
        (lambda e: e["messages"][0].update(status="streaming"), "still streaming"),
        (lambda e: e["messages"][0].update(status="weird"), "messages\\[0\\].status"),
        (lambda e: e["messages"][0].update(created_at="2026-12-01T09:00:00"), "time zone|timezone"),
        (lambda e: e["messages"][0].update(content="a\x00b"), "NUL"),
        (lambda e: e["messages"][0].update(ttft_ms=-1), "ttft_ms"),
    ],
)
def test_import_refuses_a_malformed_export_saying_where(change, says: str) -> None:  # type: ignore[no-untyped-def]
    good = _valid_export()
    assert importing.decode_export(msgspec.json.encode(good)).messages[0].content == "hi"
    change(good)
    with pytest.raises(importing.ImportRefusedError, match=says):
        importing.decode_export(msgspec.json.encode(good))


# -- ratings ------------------------------------------------------------------------------------


async def test_a_reply_is_rated_once_per_user_changed_and_removed(
    db_sessions: Sessions, owner: User, conversation: Conversation, make_user: MakeUser
) -> None:
    question, reply = await _turn(db_sessions, conversation, "q", "a")
    reply_id = UUID(reply)

    row = await ratings.rate_reply(db_sessions, owner.id, reply_id, Rating.UP, "  nice  ")
    assert (row.rating, row.comment) == (Rating.UP, "nice")
    row = await ratings.rate_reply(db_sessions, owner.id, reply_id, Rating.DOWN, None)
    listed = await ratings.conversation_ratings(db_sessions, owner.id, conversation.id)
    assert [(r.message_id, r.rating, r.comment) for r in listed] == [(reply_id, Rating.DOWN, None)]

    stranger = await make_user("stranger@example.com")
    with pytest.raises(NotFoundError):  # another user's reply looks missing
        await ratings.rate_reply(db_sessions, stranger.id, reply_id, Rating.UP, None)
    with pytest.raises(NotFoundError):  # a question is not a reply
        await ratings.rate_reply(db_sessions, owner.id, UUID(question), Rating.UP, None)
    assert await ratings.conversation_ratings(db_sessions, stranger.id, conversation.id) is None

    assert await ratings.remove_rating(db_sessions, owner.id, reply_id) is True
    assert await ratings.remove_rating(db_sessions, owner.id, reply_id) is False
    assert await ratings.conversation_ratings(db_sessions, owner.id, conversation.id) == []


async def test_ratings_go_with_their_conversation(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    _, reply = await _turn(db_sessions, conversation, "q", "a")
    await ratings.rate_reply(db_sessions, owner.id, UUID(reply), Rating.UP, None)
    assert await conversations.delete_conversation(db_sessions, owner.id, conversation.id)
    assert await ratings.ratings_of_messages(db_sessions, [UUID(reply)]) == []


async def test_migration_0007_adds_and_removes_the_ratings_table(database_url: str) -> None:
    # The revision before 0007, as the chain says (the lead may chain more revisions in between).
    before = ScriptDirectory.from_config(alembic_config()).get_revision("0007").down_revision
    assert isinstance(before, str)
    await upgrade_database_async(database_url)
    has = lambda c: "reply_ratings" in inspect(c).get_table_names()  # noqa: E731
    assert await _inspect(database_url, has)
    await downgrade_database_async(database_url, before)
    assert await current_revision(database_url) == before
    assert not await _inspect(database_url, has)
    await upgrade_database_async(database_url)
    assert await current_revision(database_url) == head_revision()
    assert await _inspect(database_url, has)


# -- the admin's view of ratings ----------------------------------------------------------------


async def test_admin_filters_by_rating_and_counts_ratings_per_day(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from app.domain.admin.queries import ConversationFilter, admin_list_conversations
    from app.domain.admin.queries import rating_counts_per_day as per_day
    from app.domain.chat.models import ReplyRating

    liked = conversation
    disliked = await conversations.create_conversation(db_sessions, owner.id, "other")
    unrated = await conversations.create_conversation(db_sessions, owner.id, "unrated")
    _, up = await _turn(db_sessions, liked, "q", "a")
    _, down = await _turn(db_sessions, disliked, "q", "a")
    await _turn(db_sessions, unrated, "q", "a")
    await ratings.rate_reply(db_sessions, owner.id, UUID(up), Rating.UP, "good")
    await ratings.rate_reply(db_sessions, owner.id, UUID(down), Rating.DOWN, None)

    async def listed(rating: Rating | None) -> set[UUID]:
        page = await admin_list_conversations(db_sessions, ConversationFilter(rating=rating))
        return {row.conversation.id for row in page.items}

    assert await listed(Rating.UP) == {liked.id}
    assert await listed(Rating.DOWN) == {disliked.id}
    assert await listed(None) == {liked.id, disliked.id, unrated.id}

    day = datetime(2030, 5, 6, tzinfo=UTC)
    async with db_sessions() as session, session.begin():
        await session.execute(
            update(ReplyRating)
            .where(ReplyRating.message_id == UUID(up))
            .values(updated_at=day + timedelta(hours=23, minutes=59))
        )
        await session.execute(
            update(ReplyRating)
            .where(ReplyRating.message_id == UUID(down))
            .values(updated_at=day + timedelta(days=1, minutes=1))
        )
    counts = await per_day(
        db_sessions, since=day - timedelta(days=1), until=day + timedelta(days=3)
    )
    assert [(c.day, c.rating, c.count) for c in counts] == [
        (day, Rating.UP, 1),
        (day + timedelta(days=1), Rating.DOWN, 1),
    ]
