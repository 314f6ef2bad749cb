"""The conversation list and the sidebar (static/js/conversation-list.js, sidebar.js): rename in
place, delete after a confirmation, and the drawer on small screens. No reply is needed, so the
conversations are made through the API."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import expect

from e2e.conftest import User
from e2e.helpers import ChatPage, api_json, csrf_headers


def make_conversation(user: User, title: str) -> str:
    request = user.context.request
    response = request.post(
        "/api/conversations", data={"title": title}, headers=csrf_headers(user.context, request)
    )
    assert response.status == 201, response.text()
    return response.json()["id"]


def titles(user: User) -> list[str]:
    return [c["title"] for c in api_json(user.context.request, "/api/conversations")]


def test_rename_and_delete_conversations_in_the_list(new_user: Callable[..., User]) -> None:
    user = new_user("lists")
    older = make_conversation(user, "Older")
    newer = make_conversation(user, "Newer")
    chat = ChatPage(user.page).open()
    page = chat.page
    items = page.get_by_test_id("conversation")
    expect(items).to_have_count(2)
    first = items.nth(0)
    expect(first).to_have_attribute("data-conversation-id", newer)
    expect(first).to_have_class(re.compile(r"\bis-current\b"))
    expect(page.get_by_test_id("conversation-title")).to_have_text("Newer")

    # Rename in place: Enter saves (the open conversation's heading follows), Esc does not.
    first.get_by_test_id("rename-conversation").click()
    page.get_by_test_id("rename-input").fill("Renamed")
    page.get_by_test_id("rename-input").press("Enter")
    expect(first.get_by_test_id("conversation-link")).to_have_text("Renamed")
    expect(page.get_by_test_id("conversation-title")).to_have_text("Renamed")
    expect(first.get_by_test_id("rename-conversation")).to_be_focused()
    first.get_by_test_id("rename-conversation").click()
    page.get_by_test_id("rename-input").fill("Not this")
    page.get_by_test_id("rename-input").press("Escape")
    expect(first.get_by_test_id("conversation-link")).to_have_text("Renamed")
    assert sorted(titles(user)) == ["Older", "Renamed"]

    # Delete asks first: Cancel keeps it; Delete removes it and opens the next one.
    first.get_by_test_id("delete-conversation").click()
    expect(page.locator("#confirm-dialog")).to_be_visible()
    expect(page.locator("#confirm-text")).to_contain_text("“Renamed”")
    page.get_by_test_id("cancel-delete").click()
    expect(page.locator("#confirm-dialog")).to_be_hidden()
    expect(items).to_have_count(2)
    first.get_by_test_id("delete-conversation").click()
    page.get_by_test_id("confirm-delete").click()
    expect(items).to_have_count(1)
    expect(items.nth(0)).to_have_attribute("data-conversation-id", older)
    expect(page).to_have_url(re.compile(f"#{older}$"))
    expect(page.get_by_test_id("conversation-title")).to_have_text("Older")
    assert titles(user) == ["Older"]

    # The last one: no conversation is open, and the list says it is empty.
    items.nth(0).get_by_test_id("delete-conversation").click()
    page.get_by_test_id("confirm-delete").click()
    expect(items).to_have_count(0)
    expect(page.locator("#conversations-empty")).to_be_visible()
    expect(page.get_by_test_id("conversation-title")).to_have_text("New chat")
    assert page.evaluate("location.hash") == ""
    assert titles(user) == []


def test_the_sidebar_is_a_drawer_on_small_screens(new_user: Callable[..., User]) -> None:
    user = new_user("drawer")
    make_conversation(user, "Only")
    page = user.page
    page.set_viewport_size({"width": 420, "height": 800})
    ChatPage(page).open()
    sidebar = page.locator("#sidebar")
    toggle = page.get_by_test_id("sidebar-toggle")
    expect(sidebar).to_be_hidden()

    for close in ("Escape", "backdrop", "close button"):
        toggle.click()
        expect(sidebar).to_be_visible()
        expect(toggle).to_have_attribute("aria-expanded", "true")
        expect(page.get_by_test_id("new-chat")).to_be_focused()
        if close == "Escape":
            page.keyboard.press("Escape")
            expect(toggle).to_be_focused()
        elif close == "backdrop":
            page.mouse.click(410, 400)  # beside the drawer, on the backdrop
        else:
            page.locator("#sidebar-close").click()
            expect(toggle).to_be_focused()
        expect(sidebar).to_be_hidden()
        expect(toggle).to_have_attribute("aria-expanded", "false")

    # Picking a conversation closes the drawer.
    toggle.click()
    page.get_by_test_id("conversation-link").click()
    expect(sidebar).to_be_hidden()
    expect(page.get_by_test_id("conversation-title")).to_have_text("Only")


def test_new_chat_reuses_a_conversation_that_is_still_empty(new_user: Callable[..., User]) -> None:
    user = new_user("newchat")
    page = ChatPage(user.page).open().page
    items = page.get_by_test_id("conversation")
    expect(items).to_have_count(0)
    page.get_by_test_id("new-chat").click()
    expect(items).to_have_count(1)
    expect(page.get_by_test_id("composer")).to_be_focused()
    # Not "networkidle": the page's push channel (static/js/push.js, `GET /api/events`) is a
    # request that never ends. The POST it should not make is watched for instead: newChat issues
    # it before its first await and moves the focus back only once it is answered, so with the
    # composer focused again after the click, any such POST has been seen.
    posts: list[str] = []
    page.on(
        "request",
        lambda r: (
            posts.append(r.url)
            if r.method == "POST" and r.url.endswith("/api/conversations")
            else None
        ),
    )
    page.get_by_test_id("new-chat").click()
    expect(page.get_by_test_id("composer")).to_be_focused()
    assert posts == []
    assert len(titles(user)) == 1
    expect(items).to_have_count(1)
