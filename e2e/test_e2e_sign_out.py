"""Effective at once (issue 24, item 3), in two browsers: a user streams a long reply; the admin,
in another browser context, disables them from the users page. The user's page shows the reply
stopped (saved `cancelled`, its text kept), then the log-in page. Over the WebSocket (the
socket's `final`, then its close with 4401) and over SSE (the reply's `final`, and `signed_out`
on the page's `GET /api/events`)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from e2e.conftest import User
from e2e.helpers import STORY, ChatPage, ask_for_longer_replies, db_message


@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_a_user_disabled_while_streaming_sees_the_reply_stopped_then_the_log_in_page(
    admin: User, new_user: Callable[..., User], database_url: str, transport: str
) -> None:
    user = new_user("streamer")
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)
    expect(user.page.locator("#app")).to_have_attribute("data-push", "connected")
    ask_for_longer_replies(user.page, 2000, only=STORY)  # still streaming when the admin acts
    reply = chat.send(STORY)
    chat.wait_text(reply, 20)
    message_id = reply.get_attribute("data-message-id")
    assert message_id

    users_page = admin.context.new_page()
    users_page.goto(f"/admin/users?q={user.email}")
    users_page.once("dialog", lambda dialog: dialog.accept())  # "Disable ...? Their sessions end"
    users_page.get_by_role("button", name=f"Disable {user.email}").click()
    row = users_page.locator(f"[data-testid=admin-user][data-email='{user.email}']")
    expect(row).to_have_attribute("data-state", "disabled")

    # The reply stops where it was, and says so; then the page goes to the log-in page.
    expect(reply).to_have_attribute("data-status", "cancelled", timeout=3_000)
    expect(chat.badge(reply)).to_have_text("stopped")
    expect(user.page.locator("#app")).to_have_attribute("data-signed-out", re.compile(".+"))
    expect(user.page).to_have_url(re.compile(r"/login\?next="), timeout=5_000)
    expect(user.page.get_by_role("button", name=re.compile("log in", re.I))).to_be_visible()

    stored = db_message(database_url, message_id)
    assert stored["status"] == "cancelled"
    assert stored["content"], "the text streamed before the stop was not kept"
    users_page.close()
