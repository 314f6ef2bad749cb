"""What the model sees, on the page (issue 22, item 3), in Chromium against the real model with a
512-token context that a few turns overflow.

- The divider ("Earlier messages are outside the model's memory") sits above the first message of
  the latest reply's window, as the server stored it (`window_start_id`), after each reply, after
  an edit and a branch switch, and after a reload; none while the model saw everything.
- The context meter by the composer shows the tokens the latest reply used of the context (the
  final frame's count, then the stored one after a reload), as a labelled `role=meter`.
- In a long conversation whose window starts among messages not drawn yet (the page draws the
  newest first), no divider is drawn until scrolling up draws that message.
- A message too long for the model: the composer says so before sending and Send waits (the limit
  follows the chat's settings); one the page's lower-bound estimate lets through is refused by the
  server, whose 400 the composer shows.
- axe finds nothing serious with the divider, the meter and the too-long note, in both themes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import ChatPage, api_json, csrf_headers, screenshot

CONTEXT = 512
REPLY = 48


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"ENGINE_CONTEXT": CONTEXT, "DEFAULT_MAX_TOKENS": REPLY}


DIVIDER = "[data-testid=context-divider]"
TOPICS = ["the sea", "mountains", "bread", "trains", "owls", "rain", "castles", "dragons"]


def question(n: int) -> str:
    """About 100 tokens: three turns fill the room a 512-token context leaves."""
    words = " ".join(f"{TOPICS[(n + i) % len(TOPICS)]} and stories" for i in range(24))
    return f"Question {n}: in one sentence, what links {words}?"


def shown(page: Page) -> dict[str, Any]:
    conversation = page.evaluate("location.hash.slice(1)")
    return api_json(page.request, f"/api/conversations/{conversation}")


def check_divider_and_meter(page: Page) -> str | None:
    """The divider is where the latest reply's window starts (none: it saw everything), and the
    meter says the tokens it used; returns the window's start."""
    data = shown(page)
    reply = [m for m in data["messages"] if m["role"] == "assistant"][-1]
    start = reply["window_start_id"]
    divider = page.locator(f"#messages > {DIVIDER}")
    if start is None:
        expect(divider).to_have_count(0)
    else:
        expect(divider).to_have_count(1)
        after = page.locator(f"#messages > {DIVIDER} + [data-testid=message]")
        expect(after).to_have_attribute("data-message-id", start)
        expect(divider).to_have_text("Earlier messages are outside the model's memory")
    used = reply["prompt_tokens"] + reply["completion_tokens"]
    meter = page.get_by_test_id("context-meter")
    expect(meter).to_be_visible()
    expect(meter).to_contain_text(f"{used:,} / {CONTEXT} tokens")
    bar = page.get_by_role("meter", name="Model context used")
    expect(bar).to_have_attribute("aria-valuenow", str(min(used, CONTEXT)))
    expect(bar).to_have_attribute("aria-valuemax", str(CONTEXT))
    return start


def test_the_divider_and_the_meter_follow_the_window(new_user: Callable[..., User]) -> None:
    user = new_user("window")
    page = user.page
    chat = ChatPage(page).open()
    starts = []
    for n in range(5):
        reply = chat.send(question(n))
        assert chat.wait_done(reply, timeout_s=90) in {"completed", "length"}
        starts.append(check_divider_and_meter(page))
    assert starts[0] is None and starts[-1] is not None, starts  # it overflowed: a divider
    screenshot(page, "context-window-divider")
    for theme in ("light", "dark"):
        page.emulate_media(color_scheme=theme)
        assert_accessible(page, f"divider and meter ({theme})")

    # A reload draws the same, from the stored counts.
    chat.reload()
    assert check_divider_and_meter(page) == starts[-1]

    # Edit the second question: its branch is short, so the model saw all of it: no divider.
    second = chat.user_messages().nth(1)
    second.get_by_test_id("edit").click()
    second.get_by_test_id("edit-input").fill("Name a fruit.")
    second.get_by_test_id("edit-save").click()
    edited = chat.assistant_messages().nth(1)
    expect(edited).not_to_have_attribute("data-status", "streaming", timeout=90_000)
    expect(chat.send_button).to_have_attribute("data-state", "idle")
    assert check_divider_and_meter(page) is None
    # Back to the first version: its long branch, and its divider.
    chat.user_messages().nth(1).get_by_test_id("branch-prev").click()
    expect(chat.user_messages()).to_have_count(5)
    assert check_divider_and_meter(page) == starts[-1]

    # Regenerate the latest reply: the same window (the prompt keeps its start).
    chat.assistant_messages().last.get_by_test_id("regenerate").click()
    again = chat.assistant_messages().last
    expect(again).not_to_have_attribute("data-status", "streaming", timeout=90_000)
    expect(chat.send_button).to_have_attribute("data-state", "idle")
    assert check_divider_and_meter(page) == starts[-1]


def imported_long(messages: int, window_from: int, prompt_tokens: int) -> dict[str, Any]:
    """A version-2 export: `messages` short messages, the last reply's window starting at message
    `window_from` (0-based), its prompt and reply tokens as a server stored them."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    ids = [str(uuid.uuid4()) for _ in range(messages)]
    rows = []
    for n in range(messages):
        row: dict[str, Any] = {
            "id": ids[n],
            "parent_id": ids[n - 1] if n else None,
            "role": "user" if n % 2 == 0 else "assistant",
            "content": f"Message {n}.",
            "status": "completed",
            "created_at": (start + timedelta(minutes=n)).isoformat(),
        }
        if n == messages - 1:
            row |= {"window_start_id": ids[window_from], "prompt_tokens": prompt_tokens}
            row["completion_tokens"] = 20
        rows.append(row)
    at = start.isoformat()
    conversation = {"title": "Long", "source": "page", "created_at": at, "updated_at": at}
    return {
        "format": "streamchat.conversation",
        "version": 2,
        "exported_at": at,
        "conversation": {**conversation, "current_leaf_id": ids[-1]},
        "messages": rows,
    }


def test_no_divider_until_the_windows_start_is_drawn(new_user: Callable[..., User]) -> None:
    user = new_user("paged")
    page, request = user.page, user.context.request
    document = imported_long(120, window_from=20, prompt_tokens=300)
    imported = request.post(
        "/api/conversations/import",
        data=json.dumps(document),
        headers={**csrf_headers(user.context, request), "content-type": "application/json"},
    )
    assert imported.status == 201, imported.text()
    conversation = imported.json()["id"]
    stored = api_json(request, f"/api/conversations/{conversation}?limit=500")["messages"]
    start_id = stored[-1]["window_start_id"]
    assert start_id == stored[20]["id"], "the import kept the window"

    page.goto(f"/#{conversation}")
    expect(page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
    messages = page.locator("#messages > [data-testid=message]")
    expect(messages.last).to_contain_text("Message 119.")
    assert messages.count() < 100  # the newest first: the window's start is not drawn
    expect(page.locator(DIVIDER)).to_have_count(0)
    expect(page.get_by_test_id("context-meter")).to_contain_text(f"320 / {CONTEXT} tokens")

    # Scrolling up draws older messages; once the window's start is drawn, the divider is above it.
    for _ in range(10):
        if page.locator(f'[data-message-id="{start_id}"]').count():
            break
        page.locator("#messages").evaluate("(el) => { el.scrollTop = 0; }")
        page.wait_for_timeout(300)
    expect(page.locator(DIVIDER)).to_have_count(1)
    after = page.locator(f"#messages > {DIVIDER} + [data-testid=message]")
    expect(after).to_have_attribute("data-message-id", start_id)
    expect(after).to_contain_text("Message 20.")


def test_a_message_too_long_is_said_before_sending_and_the_servers_refusal_shown(
    new_user: Callable[..., User],
) -> None:
    user = new_user("toolong")
    page = user.page
    chat = ChatPage(page).open()
    chat.new_chat()
    page.wait_for_function("() => location.hash.length > 1")
    conversation = chat.conversation_id()
    expect(page.get_by_test_id("context-meter")).to_contain_text(f"0 / {CONTEXT} tokens")
    limit = api_json(page.request, f"/api/conversations/{conversation}")["context"][
        "max_message_tokens"
    ]
    assert 0 < limit < CONTEXT - REPLY

    note = page.get_by_test_id("composer-limit")
    chat.composer.fill("word " * (limit + 10))
    expect(note).to_be_visible()
    expect(note).to_contain_text(f"the longest that fits is {limit}")
    expect(chat.send_button).to_be_disabled()
    expect(chat.send_button).to_have_accessible_description(note.inner_text())
    chat.composer.press("Enter")  # Enter does not send it either
    expect(chat.user_messages()).to_have_count(0)
    for theme in ("light", "dark"):
        page.emulate_media(color_scheme=theme)
        assert_accessible(page, f"too-long message ({theme})")
    screenshot(page, "context-window-too-long")

    # Shortened: Send is back.
    chat.composer.fill("word " * (limit // 2))
    expect(note).to_be_hidden()
    expect(chat.send_button).to_be_enabled()

    # A longer reply length in the chat's settings leaves less room: the same draft is now over.
    page.get_by_test_id("open-settings").click()
    page.get_by_test_id("set-max_tokens").fill(str(CONTEXT - limit // 3))
    page.get_by_test_id("settings-save").click()
    expect(note).to_be_visible()
    expect(chat.send_button).to_be_disabled()
    page.get_by_test_id("open-settings").click()
    reply_length = page.get_by_test_id("set-max_tokens")
    expect(reply_length).to_have_value(str(CONTEXT - limit // 3))  # the chat's, loaded
    reply_length.fill(str(REPLY))
    page.get_by_test_id("settings-save").click()
    expect(note).to_be_hidden()
    chat.composer.focus()

    # Numbers the estimate counts 3 digits a token (SmolLM2 spends one per digit): the page lets
    # them go, the server refuses them naming the limit, and they come back into the composer.
    words = "1234567890 " * (limit // 5)
    chat.composer.fill(words)
    expect(note).to_be_hidden()
    chat.send_button.click()
    error = page.get_by_test_id("composer-error")
    expect(error).to_contain_text(f"the longest that fits is {limit} tokens")
    expect(chat.composer).to_have_value(words)
    expect(chat.user_messages()).to_have_count(0)
