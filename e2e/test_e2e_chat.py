"""The chat page in Chromium against the real SmolLM2 model, over SSE and over WebSocket.

Each test picks the transport with the page's own toggle (data-testid=transport) and checks what a
user sees: tokens appearing one after another, Stop leaving exactly the stored text with a
"stopped" badge, history coming back on reload, and a reply surviving a network drop.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from e2e.conftest import E2E_ENV, User
from e2e.helpers import (
    STORY,
    ChatPage,
    ask_for_longer_replies,
    db_message,
    screenshot,
    stop_mid_reply_then_reload,
    wait_engine_idle,
)

TRANSPORTS = ["sse", "ws"]
ESSAY = "Write a 2000-word essay about the history of Rome."


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tokens_arrive_progressively(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    """The streaming message's text changes many times before the final event, always growing
    (each sample's text is a prefix of the next), and ends as exactly the stored reply."""
    chat = ChatPage(new_user().page).open()
    chat.use_transport(transport)
    chat.start_sampling()
    reply = chat.send(STORY)
    chat.wait_text(reply, 80)
    screenshot(chat.page, f"chat-mid-stream-{transport}")
    status = chat.wait_done(reply)
    assert status in ("completed", "length"), status

    samples = chat.samples()
    streaming = [s for s in samples if s["send"] == "streaming" and s["status"] == "streaming"]
    distinct = [s for s in streaming if s["dom"]]
    assert len({s["dom"] for s in distinct}) >= 3, (
        f"only {len(distinct)} distinct texts while streaming: {samples!r}"
    )
    stored = chat.stored(reply)
    raws = [s["raw"] for s in distinct]
    for before, after in itertools.pairwise(raws):
        assert after.startswith(before) and len(after) > len(before), (before, after)
    assert stored["content"].startswith(raws[-1])
    assert len(raws[0]) < len(stored["content"]) / 2, "the first text showed late"
    # Spread out in time, not one burst: the first text shows well before the last sample.
    assert distinct[-1]["t"] - distinct[0]["t"] > 300, [s["t"] for s in distinct]

    assert stored["status"] == status
    chat.assert_screen_is(reply, stored["content"])
    assert db_message(database_url, stored["id"])["content"] == stored["content"]
    wait_engine_idle(admin.context.request)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_stop_mid_reply_then_reload(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    """Stop: "stopped" badge, the row `cancelled` with exactly the text on screen, the engine
    idle; after a reload the same text comes back with its badge."""
    chat = ChatPage(new_user().page)
    stop_mid_reply_then_reload(
        chat, admin.context.request, database_url, transport, shot=f"chat-stopped-{transport}"
    )


# The page's badge for each stored end state (a completed reply has none).
BADGES = {"cancelled": "stopped", "length": "length limit", "completed": None}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_history_comes_back_with_badges(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    """A conversation with a stopped reply and one cut by the token limit (a 2000-word essay
    takes far more than DEFAULT_MAX_TOKENS): after a reload both come back in order, with their
    texts and their badges ("stopped", "length limit")."""
    user = new_user()
    # Greedy both: the story outlasts the Stop on any machine; the essay, at the e2e server's
    # default length, reaches it (sampled, it once ended after a dozen tokens: `completed`).
    ask_for_longer_replies(user.page, {STORY: 400, ESSAY: E2E_ENV["DEFAULT_MAX_TOKENS"]})
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)
    first = chat.send(STORY)
    chat.wait_text(first, 30)
    chat.page.keyboard.press("Escape")  # Esc stops a reply, as the composer's hint says
    expect(chat.badge(first)).to_have_text("stopped", timeout=15_000)
    second = chat.send(ESSAY)
    assert chat.wait_done(second) == "length"
    expect(chat.badge(second)).to_have_text("length limit")
    expected = [("cancelled", "stopped"), ("length", "length limit")]
    texts = [chat.raw_text(first), chat.raw_text(second)]

    chat.reload()
    replies = chat.assistant_messages()
    expect(replies).to_have_count(2)
    expect(chat.user_messages()).to_have_count(2)
    for index, (status, badge) in enumerate(expected):
        expect(replies.nth(index)).to_have_attribute("data-status", status)
        expect(chat.badge(replies.nth(index))).to_have_text(badge)
        chat.assert_screen_is(replies.nth(index), texts[index])
    expect(chat.page.get_by_test_id("conversation")).to_have_count(1)
    wait_engine_idle(admin.context.request)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_network_drop_mid_reply_resumes_without_gaps_or_repeats(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    """The browser goes offline for ~1.5 s mid-reply while the server keeps writing: the page
    shows it is waiting, gets nothing while offline, then resumes from where it was and ends with
    exactly the stored text (nothing missing, nothing twice)."""
    user = new_user()
    ask_for_longer_replies(user.page, 400)  # still streaming after the outage, on any machine
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)
    reply = chat.send(ESSAY)
    chat.wait_text(reply, 40)
    message_id = reply.get_attribute("data-message-id")
    assert message_id

    user.context.set_offline(True)
    try:
        expect(chat.badge(reply)).to_have_text("offline — waiting", timeout=5_000)
        expect(chat.page.get_by_test_id("net-status")).to_be_visible()
        at_drop = chat.raw_text(reply)
        chat.page.wait_for_timeout(1_500)  # the outage itself, not an assertion
        offline_text = chat.raw_text(reply)
        server_row = db_message(database_url, message_id)
    finally:
        user.context.set_offline(False)

    assert offline_text == at_drop, "the page kept receiving text while offline"
    assert server_row["status"] == "streaming", server_row
    assert server_row["content"].startswith(offline_text)
    assert len(server_row["content"]) > len(offline_text), (
        "the server wrote nothing during the outage: there was nothing to resume"
    )

    status = chat.wait_done(reply)
    assert status in ("completed", "length"), status
    expect(chat.badge(reply)).to_have_count(1 if BADGES[status] else 0)
    stored = chat.stored(reply)
    assert stored["status"] == status
    assert stored["content"].startswith(offline_text)
    chat.assert_screen_is(reply, stored["content"])
    expect(chat.page.get_by_test_id("net-status")).to_be_hidden()
    reply.get_by_test_id("details").click()
    expect(reply.get_by_test_id("message-details")).to_contain_text("Reconnects")
    expect(reply.get_by_test_id("message-details")).to_contain_text(
        "WebSocket" if transport == "ws" else "SSE"
    )
    wait_engine_idle(admin.context.request)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reload_mid_reply_picks_the_reply_up(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    """Reloading while a reply streams: the page shows the stored part, resumes the stream where
    the stored text ends, and finishes with exactly the stored reply."""
    user = new_user()
    ask_for_longer_replies(user.page, 300)  # still streaming after the reload, on any machine
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)
    reply = chat.send(STORY)
    chat.wait_text(reply, 40)
    message_id = reply.get_attribute("data-message-id")

    chat.reload()
    again = chat.assistant_messages().last
    expect(again).to_have_attribute("data-message-id", message_id or "")
    expect(again).to_have_attribute("data-status", "streaming")
    expect(chat.send_button).to_have_attribute("data-state", "streaming")
    expect(again).to_have_attribute("data-transport", transport)
    status = chat.wait_done(again)
    assert status in ("completed", "length"), status
    stored = chat.stored(again)
    assert stored["status"] == status
    chat.assert_screen_is(again, stored["content"])
    wait_engine_idle(admin.context.request)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_regenerate_replaces_the_latest_reply_in_place(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    """Only the latest reply offers Regenerate; it streams a new answer to the same question in
    the old reply's place (no second copy of the question), and after a reload the conversation
    holds the question and the new reply only."""
    chat = ChatPage(new_user().page).open()
    chat.use_transport(transport)
    first = chat.send("Name a colour.")
    chat.wait_done(first)
    second = chat.send("Name a fruit.")
    chat.wait_done(second)
    expect(first.get_by_test_id("regenerate")).to_be_hidden()
    expect(second.get_by_test_id("regenerate")).to_be_visible()
    old_id = second.get_attribute("data-message-id")
    assert old_id

    second.get_by_test_id("regenerate").click()
    fresh = chat.assistant_messages().last
    expect(fresh).not_to_have_attribute("data-message-id", old_id)
    status = chat.wait_done(fresh)
    assert status in ("completed", "length"), status
    new_id = fresh.get_attribute("data-message-id")
    assert new_id and new_id != old_id
    expect(chat.assistant_messages()).to_have_count(2)
    expect(chat.user_messages()).to_have_count(2)
    chat.assert_screen_is(fresh, chat.stored(fresh)["content"])
    screenshot(chat.page, f"chat-regenerated-{transport}")

    chat.reload()
    expect(chat.assistant_messages()).to_have_count(2)
    expect(chat.user_messages()).to_have_count(2)
    expect(chat.assistant_messages().last).to_have_attribute("data-message-id", new_id)
    stored = chat.stored_messages()
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert old_id not in {m["id"] for m in stored}
    wait_engine_idle(admin.context.request)
