"""Token quotas in the browser: the admin sets a user's daily quota on the users page (its form,
CSRF token and all); the user's page warns when little is left, and a send over the quota is
refused with a message that says when it resets, over SSE and over the WebSocket."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import ChatPage, api_json


def test_the_page_warns_when_low_and_says_when_a_used_up_quota_resets(
    admin: User, new_user: Callable[..., User]
) -> None:
    user = new_user("quota")
    users_page = admin.page
    users_page.goto(f"/admin/users?q={user.email}")
    row = users_page.locator(f"[data-testid=admin-user][data-email='{user.email}']")
    row.get_by_test_id("quota-per-day").fill("1")
    row.get_by_test_id("quota-save").click()
    expect(users_page).to_have_url(re.compile(r"/admin/users$"))  # saved: back to the list
    users_page.goto(f"/admin/users?q={user.email}")
    expect(row.get_by_test_id("quota-day")).to_contain_text("/ 1")
    assert_accessible(users_page, "/admin/users with its quota forms")

    chat = ChatPage(user.page).open()
    expect(chat.page.get_by_test_id("quota-left")).to_be_hidden()  # nothing used yet: no notice
    reply = chat.send("Say hello.")
    chat.wait_done(reply)
    notice = chat.page.get_by_test_id("quota-left")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("0 of your 1 tokens left today")
    assert_accessible(chat.page, "the chat page with the low-quota notice")
    resets = api_json(chat.page.request, "/api/quota")["day_resets_at"][:10] + " 00:00 UTC"

    for transport in ("sse", "ws"):
        chat.use_transport(transport)
        before = chat.assistant_messages().count()
        chat.composer.fill(f"One more, over {transport}.")
        chat.send_button.click()
        error = chat.page.get_by_test_id("composer-error")
        expect(error).to_be_visible()
        expect(error).to_contain_text("token quota for this day")
        expect(error).to_contain_text(resets)
        expect(chat.composer).to_have_value(f"One more, over {transport}.")  # kept to send later
        expect(chat.assistant_messages()).to_have_count(before)  # nothing was added
