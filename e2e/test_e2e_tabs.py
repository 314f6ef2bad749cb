"""Several tabs and devices (static/js/push.js, tab-sync.js): two browser contexts of one user (tab
1 on SSE, tab 2 on the WebSocket, so both push channels are used) and one of another user, against
the real model. A reply sent in tab 1 streams in tab 2, which stops it; renames, deletions and new
conversations show in the other tab within a second; the other user's page hears nothing."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, WebSocket, expect

from e2e.conftest import User, watch_pages
from e2e.helpers import (
    ARTIFACTS,
    STORY,
    ChatPage,
    ask_for_longer_replies,
    csrf_headers,
    wait_until,
)
from tests.live_server import TEST_PASSWORD, LiveServer

WITHIN_A_SECOND_MS = 1000


@pytest.fixture
def second_device(browser: Browser, server: LiveServer) -> Iterator[Callable[[User], User]]:
    """Another browser context logged in as the same user (another device, in effect)."""
    opened: list[User] = []

    def log_in(user: User) -> User:
        context = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 800})
        context.set_default_timeout(15_000)
        same = User(user.email, context, user.is_admin)
        watch_pages(context, same.page_errors)
        response = context.request.post(
            "/api/auth/login",
            data={"email": user.email, "password": TEST_PASSWORD},
            headers=csrf_headers(context, context.request),
        )
        assert response.status == 200, response.text()
        opened.append(same)
        return same

    yield log_in
    errors = [e for u in opened for e in u.page_errors]
    for u in opened:
        u.context.close()
    assert not errors, f"uncaught errors in the second device's page: {errors}"


def open_chat(user: User, transport: str) -> ChatPage:
    chat = ChatPage(user.page).open()
    if transport != "sse":
        chat.use_transport(transport)
        chat.reload()
    expect(chat.page.locator("#app")).to_have_attribute("data-push", "connected")
    return chat


def new_chat(chat: ChatPage) -> str:
    """Start a new conversation on the page; its id, once the page shows it."""
    before = chat.page.evaluate("location.hash.slice(1)")
    chat.new_chat()
    wait_until(
        lambda: chat.page.evaluate("location.hash.slice(1)"),
        lambda now: bool(now) and now != before,
        timeout_s=10,
        what="the new conversation is open",
    )
    return chat.conversation_id()


def listed(chat: ChatPage) -> dict[str, str]:
    """The conversation list on screen: id -> title."""
    items = chat.page.get_by_test_id("conversation")
    return {
        items.nth(i).get_attribute("data-conversation-id") or "": items.nth(i).inner_text().strip()
        for i in range(items.count())
    }


def record_socket_frames(page: Page) -> list[dict]:
    """Every frame the page's WebSockets receive, as JSON."""
    frames: list[dict] = []

    def watch(ws: WebSocket) -> None:
        ws.on("framereceived", lambda payload: frames.append(json.loads(payload)))

    page.on("websocket", watch)
    return frames


def side_by_side(context: BrowserContext, left: bytes, right: bytes, path: str) -> None:
    """One picture of two screenshots, side by side (rendered by the browser: no image library)."""
    page = context.new_page()
    images = "".join(
        f'<img style="width:50%;display:block" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode()}">'
        for png in (left, right)
    )
    page.set_content(f'<body style="margin:0;display:flex;gap:4px;background:#888">{images}</body>')
    page.set_viewport_size({"width": 2200, "height": 800})
    page.screenshot(path=path, full_page=True)
    page.close()


def test_a_reply_started_in_one_tab_streams_and_stops_in_the_other(
    new_user: Callable[..., User], second_device: Callable[[User], User]
) -> None:
    alice = new_user("tabs")
    other = new_user("stranger")
    other_frames = record_socket_frames(other.page)
    stranger = open_chat(other, "ws")
    tab1 = open_chat(alice, "sse")
    tab2 = open_chat(second_device(alice), "ws")

    # A new conversation in tab 1 shows in tab 2's list.
    conversation = new_chat(tab1)
    expect(tab2.page.locator(f'[data-conversation-id="{conversation}"]')).to_be_visible(
        timeout=WITHIN_A_SECOND_MS
    )
    tab2.page.locator(f'[data-conversation-id="{conversation}"] a').click()

    # Tab 1 sends; the reply streams in tab 2 too (with its question), and has its dot there.
    ask_for_longer_replies(tab1.page, 400)
    reply1 = tab1.send(STORY)
    reply2 = tab2.assistant_messages().first
    expect(reply2).to_have_attribute("data-status", "streaming")
    # Only the text: since the branch tree, a question also carries its "Edit" button.
    expect(tab2.user_messages().first.get_by_test_id("message-text")).to_have_text(STORY)
    item2 = tab2.page.locator(f'[data-conversation-id="{conversation}"]')
    expect(item2).to_have_class(" ".join(["conversation", "is-current", "is-streaming"]))
    tab2.wait_text(reply2, 40)
    assert reply2.get_attribute("data-message-id") == reply1.get_attribute("data-message-id")
    ARTIFACTS.mkdir(exist_ok=True)
    side_by_side(
        other.context,
        tab1.page.screenshot(),
        tab2.page.screenshot(),
        str(ARTIFACTS / "two-tabs.png"),
    )

    # Stop in tab 2: tab 1 shows the reply stopped, and both show exactly the stored text.
    expect(tab2.send_button).to_have_attribute("data-state", "streaming")
    tab2.send_button.click()
    assert tab2.wait_done(reply2) == "cancelled"
    assert tab1.wait_done(reply1) == "cancelled"
    stored = tab1.stored(reply1)
    assert stored["status"] == "cancelled" and stored["content"]
    tab1.assert_screen_is(reply1, stored["content"])
    tab2.assert_screen_is(reply2, stored["content"])
    expect(tab1.page.locator(f'[data-conversation-id="{conversation}"]')).not_to_have_class(
        "conversation is-current is-streaming"
    )

    # A rename in tab 2 shows in tab 1 (list and heading) within a second.
    item2.get_by_test_id("rename-conversation").click()
    tab2.page.get_by_test_id("rename-input").fill("Dragons, renamed in tab 2")
    tab2.page.get_by_test_id("rename-input").press("Enter")
    item1 = tab1.page.locator(f'[data-conversation-id="{conversation}"]')
    expect(item1).to_have_text("Dragons, renamed in tab 2", timeout=WITHIN_A_SECOND_MS)
    expect(tab1.page.get_by_test_id("conversation-title")).to_have_text(
        "Dragons, renamed in tab 2", timeout=WITHIN_A_SECOND_MS
    )

    # A new conversation in tab 2 shows in tab 1 within a second.
    fresh = new_chat(tab2)
    expect(tab1.page.locator(f'[data-conversation-id="{fresh}"]')).to_be_visible(
        timeout=WITHIN_A_SECOND_MS
    )

    # A delete in tab 1 shows in tab 2 within a second.
    item1.get_by_test_id("delete-conversation").click()
    tab1.page.get_by_test_id("confirm-delete").click()
    expect(tab2.page.locator(f'[data-conversation-id="{conversation}"]')).to_have_count(
        0, timeout=WITHIN_A_SECOND_MS
    )
    assert listed(tab1) == listed(tab2) == {fresh: "New chat"}

    # The other user saw none of it: an empty list, and not one event on their socket...
    time.sleep(0.5)
    assert listed(stranger) == {}
    assert [f for f in other_frames if f["type"] == "event"] == []
    # ...though their channel works: their own new conversation shows on their page.
    theirs = new_chat(stranger)
    expect(stranger.page.get_by_test_id("conversation")).to_have_count(1)
    events = [f for f in other_frames if f["type"] == "event"]
    deadline = time.monotonic() + 1
    while not events and time.monotonic() < deadline:
        stranger.page.wait_for_timeout(50)
        events = [f for f in other_frames if f["type"] == "event"]
    assert events == [
        {
            "type": "event",
            "event": "conversation_created",
            "conversation_id": theirs,
            "title": "New chat",
        }
    ]
