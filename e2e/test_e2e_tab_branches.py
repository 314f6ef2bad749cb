"""Two tabs (two pages of one browser context) and the versions of a conversation, against the
real SmolLM2 model, over SSE and over the WebSocket.

Tab 1 switches an edited question back to 1/2: tab 2, which showed 2/2, re-renders on the push
(`branch_shown`). Then tab 2 misses a switch (its push channel cut off, as a sleeping laptop's
would be) and sends while it still shows the other version: the reply is written on the branch
tab 2 shows, under its question, not on the one the server showed last; tab 1 then shows it too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, Page, WebSocketRoute, expect

from e2e.conftest import User
from e2e.helpers import ChatPage, screenshot, wait_engine_idle

TRANSPORTS = ["sse", "ws"]
PUSH_MS = 5_000  # the push reaches the other tab at once; a loaded CI machine is slow to draw


def position(message: Locator) -> Locator:
    return message.get_by_test_id("branch-position")


def question_text(chat: ChatPage, index: int) -> Locator:
    return chat.user_messages().nth(index).get_by_test_id("message-text")


def open_tab(page: Page, conversation_id: str) -> ChatPage:
    page.goto(f"/#{conversation_id}")
    chat = ChatPage(page)
    expect(page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
    return chat


def cut_off_branch_pushes(page: Page) -> None:
    """The page stops hearing of version switches (its other events and replies still come):
    over SSE the push stream is refused; over the WebSocket its `branch_shown` frames are
    dropped on the way in."""
    page.route("**/api/events", lambda route: route.abort())

    def relay(ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()

        def to_page(message: str | bytes) -> None:
            if isinstance(message, str) and '"branch_shown"' in message:
                return
            ws.send(message)

        ws.on_message(lambda message: server.send(message))
        server.on_message(to_page)

    page.route_web_socket("**/ws", relay)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_switch_reaches_the_other_tab_and_a_stale_tab_sends_after_what_it_shows(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    user = new_user()
    tab1 = ChatPage(user.page).open()
    tab1.use_transport(transport)  # (remembered by the browser: tab 2 uses it too)
    tab1.wait_done(tab1.send("Name a colour."))
    tab1.wait_done(tab1.send("Name a fruit."))
    question = tab1.user_messages().nth(1)
    question.get_by_test_id("edit").click()
    question.get_by_test_id("edit-input").fill("Name a vegetable.")
    question.get_by_test_id("edit-save").click()
    assert tab1.wait_done(tab1.assistant_messages().nth(1)) in ("completed", "length")
    conversation_id = tab1.conversation_id()

    # Tab 2 shows the conversation as it is: the edited question, 2/2.
    tab2 = open_tab(user.context.new_page(), conversation_id)
    expect(tab2.page.locator("#app")).to_have_attribute("data-push", "connected")
    expect(question_text(tab2, 1)).to_have_text("Name a vegetable.")
    expect(position(tab2.user_messages().nth(1))).to_have_text("2/2")

    # Tab 1 switches back to 1/2: tab 2 re-renders on the push.
    tab1.user_messages().nth(1).get_by_test_id("branch-prev").click()
    expect(question_text(tab1, 1)).to_have_text("Name a fruit.")
    expect(question_text(tab2, 1)).to_have_text("Name a fruit.", timeout=PUSH_MS)
    expect(position(tab2.user_messages().nth(1))).to_have_text("1/2")
    fruit_reply_id = tab1.assistant_messages().nth(1).get_attribute("data-message-id")
    expect(tab2.assistant_messages().nth(1)).to_have_attribute(
        "data-message-id", fruit_reply_id or ""
    )
    screenshot(tab2.page, f"tab-branch-pushed-{transport}")

    # Tab 2 no longer hears of switches; tab 1 shows the edited question again (2/2).
    cut_off_branch_pushes(tab2.page)
    tab2.reload()
    expect(question_text(tab2, 1)).to_have_text("Name a fruit.")
    with tab1.page.expect_response(lambda r: r.url.endswith("/branch")) as switched:
        tab1.user_messages().nth(1).get_by_test_id("branch-next").click()
    assert switched.value.status == 200
    expect(question_text(tab1, 1)).to_have_text("Name a vegetable.")
    tab2.page.wait_for_timeout(1000)  # what a push would have changed by now
    expect(question_text(tab2, 1)).to_have_text("Name a fruit.")
    assert tab1.stored_messages(conversation_id)[2]["content"] == "Name a vegetable."

    # Tab 2 sends after what it shows: the reply is written under "Name a fruit.".
    reply = tab2.send("Name another fruit.")
    assert tab2.wait_done(reply) in ("completed", "length")
    reply_id = reply.get_attribute("data-message-id")
    stored = tab2.stored_messages(conversation_id)
    assert [m["role"] for m in stored] == ["user", "assistant"] * 3
    assert [stored[i]["content"] for i in (0, 2, 4)] == [
        "Name a colour.",
        "Name a fruit.",
        "Name another fruit.",
    ]
    assert stored[3]["id"] == fruit_reply_id and stored[5]["id"] == reply_id
    assert stored[4]["parent_id"] == fruit_reply_id
    tab2.assert_screen_is(reply, stored[5]["content"])
    expect(question_text(tab2, 1)).to_have_text("Name a fruit.")

    # Tab 1 heard the reply start and shows the branch it is on.
    expect(tab1.assistant_messages().nth(2)).to_have_attribute(
        "data-message-id", reply_id or "", timeout=PUSH_MS
    )
    expect(question_text(tab1, 1)).to_have_text("Name a fruit.")
    expect(question_text(tab1, 2)).to_have_text("Name another fruit.")
    screenshot(tab1.page, f"tab-stale-send-{transport}")
    wait_engine_idle(admin.context.request)
