"""Search, export/import and reply ratings on real SQLite and PostgreSQL (issue 11, items 4, 6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

import msgspec
import pytest
from sqlalchemy import inspect

from app.db.migrate import current_revision, downgrade_database_async, upgrade_database_async
from app.domain.accounts.models import User
from app.domain.chat import conversations, export, importing, ratings, reply_rows, search
from app.domain.chat.models import Conversation, Rating
from app.domain.chat.replies import NotFoundError
from app.streaming.events import Status
from tests.db.chat_rows import Sessions, finish_reply
from tests.db.test_db_migrations import _inspect

MakeUser = Callable[..., Awaitable[User]]


async def _turn(
    sessions: Sessions, conversation: Conversation, question: str, answer: str, **fields: object
) -> tuple[str, str]:
    asked, reply = await reply_rows.add_turn(sessions, conversation.id, question, "m")
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


async def test_search_skips_replaced_replies(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    _, reply_id = await _turn(db_sessions, conversation, "q", "an obsolete answer")
    reply = await reply_rows.get_message_unscoped(db_sessions, UUID(reply_id))
    assert reply is not None
    await reply_rows.replace_reply(db_sessions, reply, "m")
    assert await search.search_conversations(db_sessions, owner.id, "obsolete") == []


def test_snippet_cuts_around_the_match() -> None:
    text = "a" * 100 + " needle " + "b" * 100
    cut = search.snippet(text, "NEEDLE", context=5)
    assert cut == search.Snippet("…aaaa ", "needle", " bbbb…")


# -- export and import --------------------------------------------------------------------------


async def test_export_then_import_keeps_rows_statuses_and_timings(
    db_sessions: Sessions, owner: User, conversation: Conversation, make_user: MakeUser
) -> None:
    await _turn(
        db_sessions,
        conversation,
        "first",
        "one two",
        ttft_ms=12.5,
        gap_p50_ms=3.0,
        prompt_tokens=7,
        completion_tokens=2,
        finish_reason="stop",
    )
    _, stopped = await _turn(
        db_sessions,
        conversation,
        "second",
        "cut sh",
        status=Status.CANCELLED,
        cancel_token_index=2,
        tokens_after_cancel=1,
    )
    old = await reply_rows.get_message_unscoped(db_sessions, UUID(stopped))
    assert old is not None
    new = await reply_rows.replace_reply(db_sessions, old, "m")  # a regenerated reply
    await finish_reply(db_sessions, new.id, Status.LENGTH, text="longer answer")

    rows = await export.conversation_rows(db_sessions, conversation.id, owner.id)
    assert rows is not None
    exported = export.to_export(*rows)
    assert [m.status for m in exported.messages] == [
        Status.COMPLETED,
        Status.COMPLETED,
        Status.COMPLETED,
        Status.CANCELLED,
        Status.LENGTH,
    ]
    assert exported.messages[3].replaced_at is not None and exported.messages[3].content == "cut sh"

    importer = await make_user("importer@example.com")
    body = export.render(*rows, "json").body
    imported = await importing.import_conversation(
        db_sessions, importer.id, importing.decode_export(body)
    )
    assert imported.user_id == importer.id and imported.title == conversation.title
    again = await export.conversation_rows(db_sessions, imported.id, importer.id)
    assert again is not None
    fields = lambda m: {k: v for k, v in msgspec.structs.asdict(m).items()}  # noqa: E731
    assert [fields(m) for m in export.to_export(*again).messages] == [
        fields(m) for m in exported.messages
    ]
    # The importer sees it like any of their chats; the owner's copy is untouched.
    shown = await conversations.list_messages(db_sessions, importer.id, imported.id)
    assert [m.content for m in shown or []] == ["first", "one two", "second", "longer answer"]
    assert await export.conversation_rows(db_sessions, imported.id, owner.id) is None

    markdown = export.to_markdown(*rows)
    assert "## You\n\nsecond" in markdown and "longer answer" in markdown
    assert "cut sh" not in markdown  # the replaced reply is not part of the chat as shown
    assert "_(stopped at the length limit)_" in markdown


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a conversation export"),
        (b'{"format": "other", "version": 1}', "format"),
        (b'{"format": "streamchat.conversation", "version": 2}', "version"),
    ],
)
def test_import_refuses_what_is_not_an_export(body: bytes, says: str) -> None:
    with pytest.raises(importing.ImportRefusedError, match=says):
        importing.decode_export(body)


def _valid_export() -> dict[str, object]:
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
    await upgrade_database_async(database_url)
    has = lambda c: "reply_ratings" in inspect(c).get_table_names()  # noqa: E731
    assert await _inspect(database_url, has)
    await downgrade_database_async(database_url, "0004")
    assert await current_revision(database_url) == "0004"
    assert not await _inspect(database_url, has)
    await upgrade_database_async(database_url)
    assert await current_revision(database_url) == "0007"
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
