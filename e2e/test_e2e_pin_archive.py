"""Pinning and archiving in Chromium (issue 22, item 8), for a user with 300 conversations: the
sidebar scrolls to the oldest, pinning one (from the keyboard, through the item's menu) moves it
to the top, here and in the user's other tab; archiving one takes it out of the list, into the
"Archived" view, and search still finds it, marked archived; opened from there, its note's
Unarchive brings it back, and so does a message sent into it. axe checks the page with an item's menu open and in the archived view.
"""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Locator, Page, expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import ChatPage, csrf_headers, screenshot

COUNT = 300


def titles(items: Locator) -> list[str]:
    return items.locator(".conv-title-text").all_text_contents()


def item(page: Page, title: str) -> Locator:
    return page.get_by_test_id("conversation").filter(
        has=page.locator(".conv-title-text", has_text=title)
    )


def open_page(page: Page) -> None:
    page.goto("/")
    expect(page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
    expect(page.locator("#app")).to_have_attribute("data-push", "connected", timeout=15_000)


def test_300_conversations_pin_archive_find_and_unarchive(
    new_user: Callable[..., User],
) -> None:
    user = new_user("filer")
    page, request = user.page, user.context.request
    headers = csrf_headers(user.context, request)
    for n in range(COUNT):
        created = request.post(
            "/api/conversations", data={"title": f"Chat {n:03}"}, headers=headers
        )
        assert created.status == 201, created.text()

    open_page(page)
    other = user.context.new_page()  # the user's other tab: hears every change
    open_page(other)

    # Scrolling reaches the oldest.
    items = page.get_by_test_id("conversation")
    nav = page.locator("#conversation-nav")
    for _ in range(10):
        if items.count() >= COUNT:
            break
        nav.evaluate("(el) => { el.scrollTop = el.scrollHeight; }")
        page.wait_for_timeout(300)
    expect(items).to_have_count(COUNT)
    expect(items.last).to_have_text("Chat 000")

    # Pin the oldest from the keyboard: its menu, then Pin. It moves to the top, under "Pinned".
    oldest = item(page, "Chat 000")
    menu = oldest.get_by_role("button", name="More actions for “Chat 000”")
    menu.focus()
    page.keyboard.press("Enter")
    expect(menu).to_have_attribute("aria-expanded", "true")
    assert_accessible(page, "an item's menu open")
    page.keyboard.press("Tab")
    expect(oldest.get_by_test_id("pin-conversation")).to_be_focused()
    page.keyboard.press("Enter")
    expect(items.first).to_have_text("Chat 000")
    expect(page.get_by_test_id("conversation-group").first).to_have_text("Pinned")
    expect(items.first.get_by_test_id("conversation-menu")).to_be_focused()  # focus kept
    expect(items).to_have_count(COUNT)
    assert titles(items)[:3] == ["Chat 000", "Chat 299", "Chat 298"]
    other_items = other.get_by_test_id("conversation")
    expect(other_items.first).to_have_text("Chat 000")  # the other tab, by its push channel
    # Escape closes a menu and gives the focus back to its button, without stopping anything.
    items.first.get_by_test_id("conversation-menu").press("Enter")
    expect(items.first.get_by_test_id("pin-conversation")).to_have_text("Unpin")
    page.keyboard.press("Escape")
    expect(items.first.get_by_test_id("conversation-menu-panel")).to_have_count(0)
    expect(items.first.get_by_test_id("conversation-menu")).to_be_focused()

    # Archive one with the mouse: out of the list, here and in the other tab.
    archived = item(page, "Chat 250")
    archived.get_by_test_id("conversation-menu").click()
    archived.get_by_test_id("archive-conversation").click()
    expect(items).to_have_count(COUNT - 1)
    expect(item(page, "Chat 250")).to_have_count(0)
    expect(item(other, "Chat 250")).to_have_count(0)
    expect(item(other, "Chat 249")).to_have_count(1)

    # ...and in the Archived view, alone.
    toggle = page.get_by_test_id("show-archived")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    expect(items).to_have_count(1)
    expect(items.first).to_have_text("Chat 250")
    expect(items.first.get_by_test_id("rename-conversation")).to_be_attached()
    assert_accessible(page, "the archived view")
    screenshot(page, "archived-view")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "false")
    expect(items.first).to_have_text("Chat 000")

    # Search still finds it, marked archived; opened, it says so, and Unarchive brings it back.
    page.get_by_test_id("search").fill("Chat 250")
    result = page.get_by_test_id("search-result")
    expect(result).to_have_count(1)
    expect(result.get_by_test_id("archived-badge")).to_have_text("Archived")
    result.locator("a").click()
    expect(page.get_by_test_id("conversation-title")).to_have_text("Chat 250")
    note = page.get_by_test_id("archived-note")
    expect(note).to_be_visible()
    page.get_by_test_id("unarchive").click()
    expect(note).to_be_hidden()
    page.get_by_test_id("search").fill("")
    expect(item(page, "Chat 250")).to_have_count(1)
    expect(item(other, "Chat 250")).to_have_count(1)
    stored = request.get("/api/conversations?archived=true").json()
    assert stored == []

    # Archived again while open, it says so; a message sent into it brings it back, on top of the
    # unpinned ones (the real model answers).
    current = item(page, "Chat 250")
    current.get_by_test_id("conversation-menu").click()
    current.get_by_test_id("archive-conversation").click()
    expect(note).to_be_visible()
    expect(item(page, "Chat 250")).to_have_count(0)
    chat = ChatPage(page)
    chat.wait_done(chat.send("Say hello."))
    expect(note).to_be_hidden()
    expect(items.nth(1)).to_have_text("Chat 250")
    expect(other.get_by_test_id("conversation").nth(1)).to_have_text("Chat 250")
    assert request.get("/api/conversations?archived=true").json() == []
    # The server's order is the sidebar's: reloaded, the pinned one still leads.
    page.reload()
    expect(page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
    expect(items.first).to_have_text("Chat 000")
