"""What a new user tripped over (issue 11, item 10), in Chromium against the real model.

- Stop says "stopping…" until the server confirms; a cancel that never reaches the server (the
  POST aborted, or the WebSocket frame dropped) says so, with a "Try again" that works.
- Enter while a reply streams says why nothing was sent, and keeps the draft.
- Similar first messages give distinct, readable titles (cut at a word, "…", " (2)"), whole on hover.
- The admin console fits a phone (its table scrolls in its own box), names the time zone of its
  times, and writes durations as the page does ("9.8 s", not "9832 ms").
- The chat's top bar fits from a 320 px phone up, its less-used controls in a "⋯" menu (issue 22,
  item 10).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from playwright.sync_api import Route, WebSocketRoute, expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import (
    RUNS_TO_THE_LIMIT,
    STORY,
    ChatPage,
    ask_for_longer_replies,
    screenshot,
    wait_engine_idle,
)

TRANSPORTS = ["sse", "ws"]


def hold_cancels_sse(page) -> list[Route]:  # type: ignore[no-untyped-def]
    """POST /api/messages/{id}/cancel requests are held (not answered) until the test decides."""
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    page.route("**/api/messages/*/cancel", hold)
    return held


# The reply must outlast Stop's 5 s grace (static/js/stream.js, stopGraceMs) and the retry after it:
# 400 tokens took ~5 s on a fast box and once ended (length) before the retry's Stop arrived.
# RUNS_TO_THE_LIMIT makes STORY run to the limit; the test stops it, so its length costs nothing.
LONGER_THAN_THE_STOP_GRACE = 1500


def longer_and_drop_cancels_ws(page, dropping: dict[str, bool]) -> None:  # type: ignore[no-untyped-def]
    """The WebSocket: sends ask for long greedy replies; cancel frames vanish while
    `dropping["on"]` (the server never hears them)."""

    def ws(route: WebSocketRoute) -> None:
        server = route.connect_to_server()

        def to_server(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "cancel" and dropping["on"]:
                return
            if frame.get("type") == "send":
                frame.update({"max_tokens": LONGER_THAN_THE_STOP_GRACE, **RUNS_TO_THE_LIMIT})
            server.send(json.dumps(frame))

        route.on_message(to_server)

    page.route_web_socket("**/ws", ws)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stop_that_does_not_reach_the_server_says_so_and_can_be_retried(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    user = new_user()
    page = user.page
    dropping = {"on": True}
    held: list[Route] = []
    if transport == "sse":
        ask_for_longer_replies(page, LONGER_THAN_THE_STOP_GRACE)
        held = hold_cancels_sse(page)
    else:
        longer_and_drop_cancels_ws(page, dropping)
    chat = ChatPage(page).open()
    chat.use_transport(transport)
    reply = chat.send(STORY)
    chat.wait_text(reply, 20)
    chat.send_button.click()  # Stop
    expect(chat.badge(reply)).to_have_text("stopping…")
    if transport == "sse":
        for _ in range(50):  # Playwright's calls, not time.sleep, let the route handler run
            if held:
                break
            page.wait_for_timeout(100)
        assert len(held) == 1, "the cancel request never reached the route"
        held[0].abort("connectionfailed")
    # Not "stopped": the reply is still being written, and the page says the stop failed.
    error = reply.get_by_test_id("stop-error")
    expect(error).to_contain_text("Could not stop the reply", timeout=15_000)
    expect(reply).to_have_attribute("data-status", "streaming")
    expect(chat.badge(reply)).to_have_count(0)
    expect(chat.send_button).to_have_attribute("data-state", "streaming")
    before = len(chat.raw_text(reply))
    chat.wait_text(reply, before + 5)  # still growing

    # The network is back: Try again stops it for real.
    dropping["on"] = False
    if transport == "sse":
        page.unroute("**/api/messages/*/cancel")
    reply.get_by_test_id("stop-retry").click()
    expect(chat.badge(reply)).to_have_text("stopped", timeout=15_000)
    expect(error).to_have_count(0)
    assert chat.stored(reply)["status"] == "cancelled"
    wait_engine_idle(admin.context.request)


def test_enter_while_a_reply_streams_says_why_and_keeps_the_draft(
    new_user: Callable[..., User], admin: User
) -> None:
    user = new_user()
    ask_for_longer_replies(user.page, 400)
    chat = ChatPage(user.page).open()
    reply = chat.send(STORY)
    expect(chat.send_button).to_have_text("Stop")
    expect(chat.page.locator("#composer-hint")).to_contain_text("Replying")
    chat.composer.fill("and another question")
    chat.composer.press("Enter")
    error = chat.page.get_by_test_id("composer-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("A reply is still being written")
    expect(chat.composer).to_have_value("and another question")
    assert chat.user_messages().count() == 1  # nothing was sent
    chat.page.keyboard.press("Escape")
    assert chat.wait_done(reply) == "cancelled"
    expect(error).to_be_hidden()  # the note goes with the reply it was about
    expect(chat.page.locator("#composer-hint")).to_contain_text("Enter sends")
    wait_engine_idle(admin.context.request)


def test_similar_first_messages_get_distinct_readable_titles(
    new_user: Callable[..., User], admin: User
) -> None:
    question = (
        "Could you explain in detail how a streaming chat server resumes a reply after the "
        "connection drops, and what the client has to remember?"
    )
    chat = ChatPage(new_user().page).open()
    titles = []
    for _ in range(2):
        chat.new_chat()
        expect(chat.assistant_messages()).to_have_count(0)  # the new, empty chat is open
        reply = chat.send(question)
        chat.wait_done(reply)
        title = chat.page.get_by_test_id("conversation-title")
        expect(title).to_have_text(re.compile("…"))
        titles.append(title.text_content() or "")
    first, second = titles
    assert first.endswith("…") and len(first) <= 80 and question.startswith(first[:-1])
    assert not first[:-1].endswith(" ") and question[len(first) - 1] == " "  # a whole word
    assert second == f"{first} (2)"
    items = chat.page.get_by_test_id("conversation").locator(".conv-title-text")
    expect(items.nth(0)).to_have_text(second)
    expect(items.nth(0)).to_have_attribute("title", second)
    expect(items.nth(1)).to_have_attribute("title", first)
    wait_engine_idle(admin.context.request)


PAGE_AND_TABLE_WIDTHS = """() => {
  const doc = document.documentElement;
  const wraps = [...document.querySelectorAll(".table-wrap")];
  return { page: doc.scrollWidth, viewport: doc.clientWidth,
           wraps: wraps.map((w) => [w.clientWidth, getComputedStyle(w).overflowX]) };
}"""


def test_the_admin_console_fits_a_phone_and_names_its_time_zone(
    new_user: Callable[..., User], admin: User
) -> None:
    chat = ChatPage(new_user().page).open()
    reply = chat.send("Say hello.")
    chat.wait_done(reply)
    page = admin.page
    page.set_viewport_size({"width": 375, "height": 740})
    page.goto("/admin")
    conversation = (
        page.get_by_test_id("admin-conversations").locator("a").first.get_attribute("href")
    )
    for path in ["/admin", "/admin/live", "/admin/charts", conversation]:
        page.goto(path or "")
        sizes = page.evaluate(PAGE_AND_TABLE_WIDTHS)
        # The page itself does not run off the edge; wide tables scroll in their own box.
        assert sizes["page"] <= sizes["viewport"], (path, sizes)
        for width, overflow in sizes["wraps"]:
            assert width <= sizes["viewport"] and overflow == "auto", (path, sizes)

    page.goto("/admin")
    table = page.get_by_test_id("admin-conversations")
    # Times name their zone (the viewer's; the server's UTC text on hover).
    when = table.locator("time").first
    expect(when).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$"))
    expect(when).to_have_attribute("title", re.compile(r"UTC \(your time zone: .+\)"))
    # Durations as the chat page writes them.
    page.goto(conversation or "")
    ttft = page.locator("[data-ms]").first
    expect(ttft).to_have_text(re.compile(r"^(\d{1,3} ms|\d+\.\d s|\d+ min \d+ s)$"))
    ms = float(ttft.get_attribute("data-ms") or "nan")
    shown = ttft.text_content() or ""
    if ms < 60_000:
        expected = f"{round(ms)} ms" if round(ms) < 1000 else f"{round(ms / 100) / 10:.1f} s"
        assert shown == expected, (ms, shown)


TOPBAR_FIT = """() => {
  const bar = document.querySelector(".topbar");
  const width = document.documentElement.clientWidth;
  const shown = [...bar.querySelectorAll("button, select, summary, h1, .model-name")]
    .filter((el) => el.getClientRects().length > 0);
  return { width, bar: [bar.scrollWidth, bar.clientWidth], page: document.documentElement.scrollWidth,
           outside: shown.filter((el) => { const r = el.getBoundingClientRect();
                                           return r.left < 0 || r.right > width + 0.5; })
                         .map((el) => el.id || el.dataset.testid || el.tagName) };
}"""


@pytest.mark.parametrize("width", [320, 390, 1280])
def test_the_top_bar_fits_from_a_small_phone_up(new_user: Callable[..., User], width: int) -> None:
    """Issue 22, item 10: nothing in the bar runs off the edge; on a phone Export, Settings, the
    transport and the theme are one "⋯" away, by pointer and by keyboard, and pass axe."""
    page = new_user(f"phone-{width}").page
    page.set_viewport_size({"width": width, "height": 720})
    chat = ChatPage(page).open()
    chat.wait_done(chat.send("Say hi."))  # a conversation, so that Export is offered
    more, tools = page.get_by_test_id("topbar-more"), page.get_by_test_id("topbar-tools")

    fit = page.evaluate(TOPBAR_FIT)
    assert fit["bar"][0] <= fit["bar"][1] and fit["page"] <= fit["width"], fit
    assert fit["outside"] == [], fit
    screenshot(page, f"topbar-{width}")

    if width >= 1280:  # everything in the bar; no menu
        expect(more).to_be_hidden()
        for control in ("export", "open-settings", "transport", "theme-toggle"):
            expect(page.get_by_test_id(control)).to_be_visible()
        return

    expect(more).to_be_visible()
    expect(more).to_have_attribute("aria-expanded", "false")
    expect(tools).to_be_hidden()
    more.click()
    expect(more).to_have_attribute("aria-expanded", "true")
    for control in ("export", "open-settings", "transport", "theme-toggle"):
        expect(page.get_by_test_id(control)).to_be_visible()
    fit = page.evaluate(TOPBAR_FIT)
    assert fit["outside"] == [] and fit["page"] <= fit["width"], fit
    screenshot(page, f"topbar-{width}-menu")
    assert_accessible(page, f"chat, {width} px, the top bar's menu open")

    # A control in the menu works, and closes it: Settings opens its dialog.
    page.get_by_test_id("open-settings").click()
    expect(page.get_by_test_id("settings-panel")).to_be_visible()
    expect(tools).to_be_hidden()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("settings-panel")).to_be_hidden()

    # By keyboard: the button opens it, Tab walks in, Escape closes it back onto the button.
    more.focus()
    page.keyboard.press("Enter")
    expect(tools).to_be_visible()
    page.keyboard.press("Tab")
    assert page.evaluate(
        "() => document.getElementById('topbar-tools').contains(document.activeElement)"
    )
    page.keyboard.press("Escape")
    expect(tools).to_be_hidden()
    expect(more).to_be_focused()
    expect(more).to_have_attribute("aria-expanded", "false")
    # The transport choice still works from the menu, and a click outside closes it.
    page.keyboard.press("Space")
    chat.use_transport("ws")
    page.get_by_test_id("messages").click(position={"x": 5, "y": 5})
    expect(tools).to_be_hidden()
