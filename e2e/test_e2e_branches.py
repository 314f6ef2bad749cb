"""Edit and branch in Chromium against the real SmolLM2 model, over SSE and over WebSocket.

A user edits a question they sent, sees its reply stream and a "2/2" switcher on the question,
switches back and forth, regenerates a reply (a switcher on the reply), and finds the branch they
chose still shown after a reload; the admin's conversation view shows the tree.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, expect

from e2e.conftest import User
from e2e.helpers import ARTIFACTS, ChatPage, screenshot, wait_engine_idle

TRANSPORTS = ["sse", "ws"]


def position(message: Locator) -> Locator:
    return message.get_by_test_id("branch-position")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_edit_switch_regenerate_and_reload(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    chat = ChatPage(new_user().page).open()
    chat.use_transport(transport)
    chat.wait_done(chat.send("Name a colour."))
    old_reply = chat.send("Name a fruit.")
    chat.wait_done(old_reply)
    old_reply_id = old_reply.get_attribute("data-message-id")
    question = chat.user_messages().nth(1)
    expect(question.get_by_test_id("branch-switcher")).to_have_count(0)  # one version so far

    # Edit the second question: it and its reply give way to the new version, which streams.
    question.get_by_test_id("edit").click()
    editor = question.get_by_test_id("edit-input")
    expect(editor).to_be_focused()
    expect(editor).to_have_value("Name a fruit.")
    editor.fill("Name a vegetable.")
    question.get_by_test_id("edit-save").click()
    edited_reply = chat.assistant_messages().nth(1)
    expect(edited_reply).not_to_have_attribute("data-message-id", old_reply_id or "")
    assert chat.wait_done(edited_reply) in ("completed", "length")
    expect(edited_reply).to_have_attribute("data-transport", transport)
    edited_reply_id = edited_reply.get_attribute("data-message-id")
    question = chat.user_messages().nth(1)
    expect(question.get_by_test_id("message-text")).to_have_text("Name a vegetable.")
    expect(position(question)).to_have_text("2/2")
    expect(chat.user_messages()).to_have_count(2)
    expect(chat.assistant_messages()).to_have_count(2)
    chat.assert_screen_is(edited_reply, chat.stored(edited_reply)["content"])

    # Back to the first version and forth again, from the keyboard-reachable buttons.
    question.get_by_test_id("branch-prev").click()
    question = chat.user_messages().nth(1)
    expect(question.get_by_test_id("message-text")).to_have_text("Name a fruit.")
    expect(position(question)).to_have_text("1/2")
    expect(question.get_by_test_id("branch-prev")).to_be_disabled()
    expect(question.get_by_test_id("branch-next")).to_be_focused()
    expect(chat.assistant_messages().nth(1)).to_have_attribute(
        "data-message-id", old_reply_id or ""
    )
    question.get_by_test_id("branch-next").click()
    question = chat.user_messages().nth(1)
    expect(question.get_by_test_id("message-text")).to_have_text("Name a vegetable.")
    expect(chat.assistant_messages().nth(1)).to_have_attribute("data-message-id", edited_reply_id or "")  # fmt: skip

    # Regenerate the reply to the edited question: a second version of the reply.
    chat.assistant_messages().nth(1).get_by_test_id("regenerate").click()
    fresh = chat.assistant_messages().nth(1)
    expect(fresh).not_to_have_attribute("data-message-id", edited_reply_id or "")
    assert chat.wait_done(fresh) in ("completed", "length")
    expect(position(fresh)).to_have_text("2/2")
    expect(position(chat.user_messages().nth(1))).to_have_text("2/2")
    fresh.scroll_into_view_if_needed()
    screenshot(chat.page, f"branch-switcher-{transport}")
    if transport == "sse":
        ARTIFACTS.mkdir(exist_ok=True)
        chat.messages.screenshot(path=str(ARTIFACTS / "branch-switcher.png"))

    # Show the first version of the reply, then reload: the page shows the branch chosen last.
    fresh.get_by_test_id("branch-prev").click()
    expect(chat.assistant_messages().nth(1)).to_have_attribute("data-message-id", edited_reply_id or "")  # fmt: skip
    chat.reload()
    reply = chat.assistant_messages().nth(1)
    expect(reply).to_have_attribute("data-message-id", edited_reply_id or "")
    expect(position(reply)).to_have_text("1/2")
    expect(chat.user_messages().nth(1).get_by_test_id("message-text")).to_have_text("Name a vegetable.")  # fmt: skip
    expect(position(chat.user_messages().nth(1))).to_have_text("2/2")

    # The admin's view of the conversation: the tree, the branch the user sees marked.
    conversation_id = chat.conversation_id()
    page = admin.page
    page.goto(f"/admin/conversations/{conversation_id}")
    expect(page.get_by_test_id("admin-message")).to_have_count(7)  # 2 + 2 + 2 versions + 1
    expect(page.locator("[data-testid=admin-message][data-shown=true]")).to_have_count(4)
    shown_branches = page.locator("[data-testid=admin-branch][data-shown=true]")
    expect(shown_branches).to_have_count(2)  # the edited question, and the first reply to it
    screenshot(page, f"admin-branches-{transport}")
    wait_engine_idle(admin.context.request)
