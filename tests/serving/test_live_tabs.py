"""A tab sends what it shows, against a real server (synthetic engine), on SQLite and PostgreSQL,
over SSE and the WebSocket.

Two tabs of one user show one conversation whose second question was edited (versions 1/2 and
2/2). Tab 1 switches back to 1/2; tab 2, which has not reloaded, still shows 2/2 and sends after
its last message (`parent_id`): the reply is written on tab 2's branch, under its question, and
its prompt is that branch (the synthetic engine counts a prompt exactly, so the reply's prompt
token count says which messages it held: tests/serving/test_live_branches.py). The switch itself
is pushed to the user's pages (`branch_shown`), so that tab 2 re-renders before it sends.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.live_server import LiveServer, PageClient, row_counts
from tests.serving.test_live_branches import (
    PARAMS,
    SHORT,
    ask,
    contents,
    edit,
    show,
    stream,
    tokens,
)
from tests.serving.test_live_push import sse_channel, ws_channel
from tests.serving.test_live_websocket import WsReply, open_socket, receive, send_json


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10}  # test_live_websocket's server: the pool shares it


def edited_conversation(client: PageClient) -> dict[str, Any]:
    """A conversation whose second question has two versions; the server shows the second (2/2)."""
    conversation = client.new_conversation()
    first = ask(client, conversation, f"{SHORT} first")
    second = ask(client, conversation, f"{SHORT} second")
    edited = edit(client, second.start["user_message_id"], f"{SHORT} second, asked otherwise")
    return {
        "id": conversation,
        "first": first,
        "old_question": second.start["user_message_id"],
        "old": second,
        "new_question": edited.start["user_message_id"],
        "new": edited,
    }


def send_after(
    server: LiveServer,
    client: PageClient,
    transport: str,
    conversation: str,
    content: str,
    parent_id: str | None,
) -> dict[str, Any]:
    """Send as a page does, over `transport`: the reply's start and final frames."""
    body: dict[str, Any] = {"content": content, **PARAMS}
    if parent_id is not None:
        body["parent_id"] = parent_id
    if transport == "sse":
        record = stream(client, f"/api/conversations/{conversation}/messages", body)
        assert record.end is not None
        return {"start": record.start, "final": record.end.json(), "text": record.text}
    with open_socket(server, client) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation, "client_ref": "s", **body})
        reply = WsReply().read(ws)
    assert reply.start["client_ref"] == "s" and reply.end is not None
    return {"start": reply.start, "final": reply.end, "text": reply.text}


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_stale_tab_sends_after_what_it_shows(
    server: LiveServer, alice: PageClient, transport: str
) -> None:
    c = edited_conversation(alice)
    first, old, new = c["first"], c["old"], c["new"]
    tab2_shows = alice.conversation(c["id"])  # 2/2, as tab 2 loaded it
    assert tab2_shows["messages"][-1]["id"] == new.message_id

    # Tab 1 switches the edited question back to 1/2: the server now shows the old branch.
    assert show(alice, c["id"], c["old_question"]).status_code == 200
    assert alice.conversation(c["id"])["messages"][-1]["id"] == old.message_id

    # Tab 2, not reloaded, sends after the last message on its screen.
    question = f"{SHORT} a follow-up to the edited one"
    sent = send_after(server, alice, transport, c["id"], question, new.message_id)
    assert sent["final"]["status"] == "completed"
    edited_text = f"{SHORT} second, asked otherwise"
    assert prompt_of_final(sent) == tokens(
        f"{SHORT} first", first.text, edited_text, new.text, question
    )

    # Written on tab 2's branch, under its question, and shown from now on.
    read = alice.conversation(c["id"])
    ids = [m["id"] for m in read["messages"]]
    assert ids[2:] == [c["new_question"], new.message_id, sent["start"]["user_message_id"],
                       sent["start"]["message_id"]]  # fmt: skip
    assert contents(read)[-2:] == [question, sent["text"]]
    assert read["messages"][2]["siblings"] == [c["old_question"], c["new_question"]]
    # The old branch is as it was: its reply is still its end.
    old_branch = show(alice, c["id"], c["old_question"]).json()
    assert [m["id"] for m in old_branch["messages"]][-1] == old.message_id


def prompt_of_final(sent: dict[str, Any]) -> int:
    return sent["final"]["usage"]["prompt_tokens"]


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_send_without_a_parent_follows_the_branch_the_server_shows(
    server: LiveServer, alice: PageClient, transport: str
) -> None:
    """Clients that do not say (older pages, scripts) keep the old rule: the current branch."""
    c = edited_conversation(alice)
    assert show(alice, c["id"], c["old_question"]).status_code == 200
    question = f"{SHORT} and then?"
    sent = send_after(server, alice, transport, c["id"], question, None)
    assert prompt_of_final(sent) == tokens(
        f"{SHORT} first", c["first"].text, f"{SHORT} second", c["old"].text, question
    )
    assert alice.conversation(c["id"])["messages"][-1]["id"] == sent["start"]["message_id"]


def test_a_parent_that_is_not_a_shown_branchs_end_is_refused_and_writes_nothing(
    server: LiveServer, alice: PageClient, bob: PageClient, live_database_url: str
) -> None:
    """Not this conversation's message (another one's, another user's, none at all): 404. One
    that something follows already (the page missed a turn added elsewhere): 409, and the page
    reloads. Over SSE and the WebSocket alike; nothing is written."""
    c = edited_conversation(alice)
    elsewhere = ask(alice, alice.new_conversation(), f"{SHORT} elsewhere")
    bobs = ask(bob, bob.new_conversation(), f"{SHORT} bob's")
    before = row_counts(live_database_url)
    shown_before = alice.conversation(c["id"])
    path = f"/api/conversations/{c['id']}/messages"
    cases = [
        (elsewhere.message_id, 404, "no such message in this conversation"),
        (bobs.message_id, 404, "no such message in this conversation"),
        ("00000000-0000-4000-8000-000000000000", 404, "no such message in this conversation"),
        (c["first"].message_id, 409, "moved on"),  # the second question follows it
        (c["old_question"], 409, "moved on"),  # a question: its reply follows it
    ]
    with open_socket(server, alice) as ws:
        for parent_id, status, words in cases:
            response = alice.post(path, {"content": "x", "parent_id": parent_id, **PARAMS})
            assert response.status_code == status, response.text
            assert words in response.json()["detail"]
            send_json(ws, {"type": "send", "conversation_id": c["id"], "content": "x",
                           "parent_id": parent_id, "client_ref": "r"})  # fmt: skip
            rejected = receive(ws)
            assert rejected["type"] == "rejected" and rejected["status"] == status, rejected
            assert words in rejected["error"] and rejected["client_ref"] == "r"
        send_json(ws, {"type": "send", "conversation_id": c["id"], "content": "x",
                       "parent_id": "not an id", "client_ref": "b"})  # fmt: skip
        assert receive(ws)["type"] == "rejected"
    assert alice.post(path, {"content": "x", "parent_id": "not an id"}).status_code == 400
    assert row_counts(live_database_url) == before
    assert alice.conversation(c["id"]) == shown_before


@pytest.mark.parametrize("channel", ["ws", "sse"])
def test_a_branch_switch_is_pushed_to_the_users_pages(
    server: LiveServer, alice: PageClient, bob: PageClient, channel: str
) -> None:
    """Both of the user's pages hear which branch is shown now (the switching page ignores it:
    it shows that branch already); another user's page hears nothing."""
    c = edited_conversation(alice)
    opened = ws_channel if channel == "ws" else sse_channel
    with opened(server, alice) as tab2, opened(server, bob) as bobs:
        assert show(alice, c["id"], c["old_question"]).status_code == 200
        assert tab2.next_event() == {
            "event": "branch_shown",
            "conversation_id": c["id"],
            "leaf_id": c["old"].message_id,
        }
        assert show(alice, c["id"], c["new_question"]).status_code == 200
        assert tab2.next_event()["leaf_id"] == c["new"].message_id
        assert bobs.events_within(0.3) == []
