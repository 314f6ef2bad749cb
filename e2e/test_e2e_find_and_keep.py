"""Finding and keeping conversations, and rating replies, in Chromium against the real model
(issue 11, items 4 and 6): search as you type with the match marked (inertly), the list grouped by
date, export as Markdown and JSON, import of the JSON back, a rating with a comment, and the
admin's filter by rating, ratings chart and export."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.sync_api import expect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from e2e.conftest import User
from e2e.helpers import (
    ChatPage,
    api_json,
    ask_for_longer_replies,
    csrf_headers,
    db_set_content,
    in_thread,
    screenshot,
)


def make_conversation(user: User, title: str) -> str:
    request = user.context.request
    response = request.post(
        "/api/conversations", data={"title": title}, headers=csrf_headers(user.context, request)
    )
    assert response.status == 201, response.text()
    return response.json()["id"]


def move_to(database_url: str, conversation_id: str, when: datetime) -> None:
    """Make a conversation's last activity `when` (straight in the database)."""
    if database_url.startswith("sqlite"):
        where, key = "hex(id) = :id", uuid.UUID(conversation_id).hex.upper()
    else:
        where, key = "id = :id", conversation_id

    async def run() -> int:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.begin() as connection:
                result = await connection.execute(
                    text(f"UPDATE conversations SET updated_at = :at WHERE {where}"),
                    {"id": key, "at": when if "postgres" in database_url else when.isoformat()},
                )
                return result.rowcount
        finally:
            await engine.dispose()

    assert in_thread(asyncio.run, run()) == 1


def test_search_groups_export_import_rate_and_the_admin_view(
    new_user: Callable[..., User], admin: User, database_url: str, tmp_path: Path
) -> None:
    user = new_user("finder")
    old = make_conversation(user, "Old notes")
    move_to(database_url, old, datetime.now(UTC) - timedelta(days=10))

    chat = ChatPage(user.page).open()
    page = chat.page
    ask_for_longer_replies(page, 6)
    chat.new_chat()
    reply = chat.send("Tell me about the aardvark")
    assert chat.wait_done(reply) in ("completed", "length")
    conversation = chat.conversation_id()
    # A reply whose text looks like markup: search must show it as text.
    planted = "Aardvarks <b>dig</b> burrows at night"
    db_set_content(database_url, reply.get_attribute("data-message-id") or "", planted)

    # The list, grouped by date in the browser's time zone.
    expect(page.get_by_test_id("conversation-group")).to_have_text(["Today", "Older"])

    # Search as you type: the match marked, the markup-like text left as text.
    page.get_by_test_id("search").press_sequentially("DIG", delay=40)
    result = page.get_by_test_id("search-result")
    expect(result).to_have_count(1)
    expect(result).to_have_attribute("data-conversation-id", conversation)
    expect(result.locator("mark")).to_have_text("dig")
    expect(result.get_by_test_id("search-snippet")).to_have_text(
        "Aardvarks <b>dig</b> burrows at night"
    )
    assert result.locator("b").count() == 0
    expect(page.get_by_test_id("conversation-list")).to_be_hidden()
    screenshot(page, "search")
    page.get_by_test_id("search").fill("no such words anywhere")
    expect(page.get_by_test_id("search-empty")).to_be_visible()
    page.get_by_test_id("search").press("Escape")
    expect(page.get_by_test_id("conversation-list")).to_be_visible()

    # Rate the reply, with a comment; it is still there after a reload.
    chat.reload()
    reply = chat.assistant_messages().last
    reply.get_by_test_id("rate-down").click()
    expect(reply.get_by_test_id("rate-down")).to_have_attribute("aria-pressed", "true")
    reply.get_by_test_id("rating-comment").fill("too short")
    reply.get_by_test_id("rating-save").click()
    expect(reply.get_by_test_id("rating-note")).to_have_text("“too short”")
    chat.reload()
    reply = chat.assistant_messages().last
    expect(reply.get_by_test_id("rate-down")).to_have_attribute("aria-pressed", "true")
    expect(reply.get_by_test_id("rating-note")).to_have_text("“too short”")

    # Export as Markdown and JSON (downloads), then import the JSON back.
    page.get_by_test_id("export").locator("summary").click()
    with page.expect_download() as markdown:
        page.get_by_test_id("export-md").click()
    assert markdown.value.suggested_filename.endswith(".md")
    assert planted in Path(markdown.value.path()).read_text()
    page.get_by_test_id("export").locator("summary").click()
    page.get_by_test_id("export").locator("summary").click()
    with page.expect_download() as exported:
        page.get_by_test_id("export-json").click()
    saved = tmp_path / exported.value.suggested_filename
    exported.value.save_as(saved)
    document = json.loads(saved.read_text())
    assert [m["content"] for m in document["messages"]] == ["Tell me about the aardvark", planted]

    page.get_by_test_id("import-file").set_input_files(str(saved))
    expect(page).not_to_have_url(re.compile(conversation))
    copy = chat.conversation_id()
    expect(chat.assistant_messages()).to_have_count(1)
    expect(chat.assistant_messages().first.get_by_test_id("message-text")).to_have_text(planted)
    expect(page.get_by_test_id("conversation")).to_have_count(3)
    assert copy != conversation
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**document, "version": 7}))
    page.get_by_test_id("import-file").set_input_files(str(bad))
    expect(page.get_by_test_id("import-error")).to_contain_text("version")

    # The admin: filter by rating, see the rating and its comment, export, the chart.
    admin_page = admin.page
    admin_page.goto("/admin")
    admin_page.get_by_test_id("filter-rating").select_option("down")
    admin_page.get_by_role("button", name="Filter").click()
    expect(admin_page).to_have_url(re.compile(r"rating=down"))
    rows = admin_page.get_by_test_id("admin-conversation")
    expect(rows).to_have_count(1)
    expect(rows).to_have_attribute("data-conversation-id", conversation)
    admin_page.goto("/admin?rating=up")
    expect(rows).to_have_count(0)
    admin_page.goto(f"/admin/conversations/{conversation}")
    expect(admin_page.get_by_test_id("admin-rating")).to_contain_text("too short")
    with admin_page.expect_download() as by_admin:
        admin_page.get_by_test_id("admin-export-json").click()
    assert planted in Path(by_admin.value.path()).read_text()
    admin_page.goto("/admin/charts")
    expect(admin_page.get_by_test_id("chart-ratings").locator("title")).to_contain_text(
        [re.compile(r"down: 1$")]
    )
    screenshot(admin_page, "admin-ratings")
    assert api_json(admin.context.request, f"/api/conversations/{conversation}/export", 404)
