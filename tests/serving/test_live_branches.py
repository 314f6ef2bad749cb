"""Edit and branch against a real server with the synthetic engine, on SQLite and PostgreSQL, over
SSE and the WebSocket.

The synthetic engine counts a prompt exactly (one token per 4 bytes of its `role: content`
transcript, app/engine/synthetic/text.py), so a reply's prompt token count says which messages
its prompt held: the branch contents here differ in length, and each expected count is computed
from the messages that branch should carry.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.engine.synthetic.text import prompt_token_count, render_prompt
from tests.live_server import LiveServer, PageClient, PageStream, SseReader, read_stream, row_counts
from tests.serving.test_live_websocket import WsReply, open_socket, receive, send_json

SHORT = "[[synthetic:tokens=6]]"
LONG = "[[synthetic:tokens=100000]]"
PARAMS: dict[str, Any] = {"max_tokens": 2000, "seed": 3}


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10}  # test_live_websocket's server: the pool shares it


def stream(client: PageClient, path: str, body: dict[str, Any]) -> PageStream:
    with client.http.stream("POST", path, json=body, headers=client.csrf_headers()) as response:
        assert response.status_code == 200, response.read()
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final", record.events[-1:]
    return record


def ask(client: PageClient, conversation: str, content: str) -> PageStream:
    return stream(client, f"/api/conversations/{conversation}/messages", {"content": content, **PARAMS})  # fmt: skip


def edit(client: PageClient, message_id: str, content: str) -> PageStream:
    return stream(client, f"/api/messages/{message_id}/edit", {"content": content, **PARAMS})


def regenerate(client: PageClient, message_id: str) -> PageStream:
    return stream(client, f"/api/messages/{message_id}/regenerate", PARAMS)


def show(client: PageClient, conversation: str, message_id: str) -> httpx.Response:
    return client.http.patch(
        f"/api/conversations/{conversation}/branch",
        json={"message_id": message_id},
        headers=client.csrf_headers(),
    )


def prompt_of(record: PageStream) -> int:
    assert record.end is not None
    return record.end.json()["usage"]["prompt_tokens"]


def tokens(*turns: str) -> int:
    """The synthetic engine's count for a prompt of these turns (user first, then alternating)."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]
    return prompt_token_count(render_prompt(messages))


def contents(conversation: dict[str, Any]) -> list[str]:
    return [m["content"] for m in conversation["messages"]]


def test_edit_streams_and_the_next_turn_follows_the_branch_shown(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    first = ask(alice, conversation, f"{SHORT} first")
    second = ask(alice, conversation, f"{SHORT} second")
    old_question = second.start["user_message_id"]

    edited_text = f"{SHORT} the second question, edited to be much longer than it was"
    edited = edit(alice, old_question, edited_text)
    new_question = edited.start["user_message_id"]
    assert new_question != old_question and len(edited.deltas) >= 1
    assert edited.end is not None and edited.end.json()["status"] == "completed"
    assert prompt_of(edited) == tokens(f"{SHORT} first", first.text, edited_text)

    read = alice.conversation(conversation)
    assert contents(read) == [f"{SHORT} first", first.text, edited_text, edited.text]
    assert read["messages"][2]["siblings"] == [old_question, new_question]
    assert read["messages"][3]["siblings"] == [edited.message_id]
    assert read["messages"][0]["siblings"] == [first.start["user_message_id"]]

    third = ask(alice, conversation, f"{SHORT} third")
    assert prompt_of(third) == tokens(
        f"{SHORT} first", first.text, edited_text, edited.text, f"{SHORT} third"
    )

    # Back to the original question: its branch, to its end; the next turn follows it.
    switched = show(alice, conversation, old_question)
    assert switched.status_code == 200, switched.text
    assert contents(switched.json()) == [f"{SHORT} first", first.text, f"{SHORT} second", second.text]  # fmt: skip
    assert alice.conversation(conversation) == switched.json()  # remembered
    fourth = ask(alice, conversation, f"{SHORT} 4")
    assert prompt_of(fourth) == tokens(
        f"{SHORT} first", first.text, f"{SHORT} second", second.text, f"{SHORT} 4"
    )

    # And to the edited one again: the newest end of its branch, the third turn's reply.
    again = show(alice, conversation, new_question).json()
    assert [m["id"] for m in again["messages"]][-1] == third.message_id
    assert again["messages"][2]["siblings"] == [old_question, new_question]


def test_regenerated_replies_are_versions_the_next_turn_can_follow(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    question = f"{SHORT} question"
    first = ask(alice, conversation, question)
    second = regenerate(alice, first.message_id)
    assert second.start["user_message_id"] == first.start["user_message_id"]
    read = alice.conversation(conversation)
    assert read["messages"][-1]["id"] == second.message_id
    assert read["messages"][-1]["siblings"] == [first.message_id, second.message_id]

    assert show(alice, conversation, first.message_id).status_code == 200
    follow_up = ask(alice, conversation, f"{SHORT} and then?")
    assert prompt_of(follow_up) == tokens(question, first.text, f"{SHORT} and then?")
    # The old version now has a turn after it; the new one, on its own branch, has none.
    refused = alice.post(f"/api/messages/{first.message_id}/regenerate", PARAMS)
    assert refused.status_code == 409 and "latest" in refused.json()["detail"]
    third = regenerate(alice, second.message_id)
    read = alice.conversation(conversation)
    assert [m["id"] for m in read["messages"]] == [first.start["user_message_id"], third.message_id]  # fmt: skip
    assert read["messages"][-1]["siblings"] == [
        first.message_id,
        second.message_id,
        third.message_id,
    ]


def test_edit_over_the_websocket(server: LiveServer, alice: PageClient, bob: PageClient) -> None:
    conversation = alice.new_conversation()
    first = ask(alice, conversation, f"{SHORT} hello")
    question = first.start["user_message_id"]
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "edit", "message_id": question, "content": f"{SHORT} hi there",
                       "client_ref": "e1", **PARAMS})  # fmt: skip
        reply = WsReply().read(ws)
        assert reply.start["client_ref"] == "e1"
        assert reply.end is not None and reply.end["status"] == "completed"
        assert reply.end["usage"]["prompt_tokens"] == tokens(f"{SHORT} hi there")
        new_question = reply.start["user_message_id"]

        # Refused, each with one answer, and the socket carries on: a reply is no question, and
        # another user's message or an unknown id is not there at all.
        for message_id in (first.message_id, "00000000-0000-4000-8000-000000000000"):
            send_json(ws, {"type": "edit", "message_id": message_id, "content": "x", "client_ref": "r"})  # fmt: skip
            assert receive(ws) == {"type": "rejected", "error": "no such message",
                                   "client_ref": "r", "status": 404}  # fmt: skip
        send_json(ws, {"type": "edit", "message_id": question, "content": " ", "client_ref": "b"})
        assert receive(ws)["status"] == 400
    with open_socket(server, bob) as ws:
        send_json(ws, {"type": "edit", "message_id": question, "content": "mine", "client_ref": "x"})  # fmt: skip
        assert receive(ws)["status"] == 404
    read = alice.conversation(conversation)
    assert read["messages"][0]["siblings"] == [question, new_question]
    assert contents(read) == [f"{SHORT} hi there", reply.text]


def test_stop_and_resume_on_a_branch(server: LiveServer, alice: PageClient) -> None:
    """An edited question's reply stops like any other; one whose socket dropped resumes over
    SSE from where it was; their end states stay on their branches."""
    conversation = alice.new_conversation()
    first = ask(alice, conversation, f"{SHORT} start")
    question = first.start["user_message_id"]

    # Stop over SSE, mid-reply.
    path = f"/api/messages/{question}/edit"
    body = {"content": f"{LONG} go on", **PARAMS}
    with alice.http.stream("POST", path, json=body, headers=alice.csrf_headers()) as response:
        assert response.status_code == 200
        record, reader = PageStream(), SseReader(response)
        for item in reader:
            event = record.add(item)
            if event is not None and len(record.deltas) >= 3:
                break
        assert alice.cancel(record.message_id).json()["status"] == "cancelled"
        read_stream(reader, record)
    assert record.end is not None and record.end.json()["status"] == "cancelled"
    stopped = alice.wait_final(conversation, record.message_id)
    assert stopped["status"] == "cancelled" and stopped["content"] == record.text

    # Resume: start another version over the WebSocket, drop it, pick it up over SSE.
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "edit", "message_id": question, "content": f"{LONG} again",
                       "client_ref": "w", **PARAMS})  # fmt: skip
        dropped = WsReply().read(ws, until_deltas=3)
    offset = len(dropped.text)
    message_id = dropped.start["message_id"]
    with alice.resume(message_id, offset) as response:
        resumed, reader = PageStream(), SseReader(response)
        for item in reader:
            event = resumed.add(item)
            if event is not None and len(resumed.deltas) >= 3:
                break
        assert alice.cancel(message_id).json()["status"] == "cancelled"
        read_stream(reader, resumed)
    assert resumed.end is not None and resumed.end.json()["status"] == "cancelled"
    stored = alice.wait_final(conversation, message_id)
    assert stored["content"] == dropped.text + resumed.text

    # Three versions of the question, each with its reply in its own end state.
    read = alice.conversation(conversation)
    versions = read["messages"][0]["siblings"]
    assert len(versions) == 3 and versions[0] == question
    ends = []
    for version in versions:
        shown = show(alice, conversation, version).json()["messages"]
        ends.append(shown[-1]["status"])
    assert ends == ["completed", "cancelled", "cancelled"]
    assert alice.wait_engine_idle(timeout_s=10)["running"] == 0


def test_refusals_write_nothing(alice: PageClient, bob: PageClient, live_database_url: str) -> None:
    conversation = alice.new_conversation()
    other = alice.new_conversation()
    first = ask(alice, conversation, f"{SHORT} mine")
    elsewhere = ask(alice, other, f"{SHORT} elsewhere")
    question = first.start["user_message_id"]
    before = row_counts(live_database_url)
    shown_before = alice.conversation(conversation)

    def edit_refused(client: PageClient, message_id: str, status: int, **body: Any) -> str:
        response = client.post(f"/api/messages/{message_id}/edit", {"content": "new", **body})
        assert response.status_code == status, response.text
        return response.json()["detail"]

    assert edit_refused(alice, first.message_id, 404) == "no such message"  # a reply
    assert edit_refused(bob, question, 404) == "no such message"
    assert "max_tokens" in edit_refused(alice, question, 400, max_tokens=0)
    assert "empty" in edit_refused(alice, question, 400, content="  ")
    assert alice.http.post(f"/api/messages/{question}/edit", json={"content": "x"}).status_code == 403  # fmt: skip

    assert show(bob, conversation, question).status_code == 404
    assert show(alice, conversation, elsewhere.message_id).status_code == 404
    assert show(alice, conversation, "00000000-0000-4000-8000-000000000000").status_code == 404
    no_csrf = alice.http.patch(
        f"/api/conversations/{conversation}/branch", json={"message_id": question}
    )
    assert no_csrf.status_code == 403
    assert row_counts(live_database_url) == before
    assert alice.conversation(conversation) == shown_before
