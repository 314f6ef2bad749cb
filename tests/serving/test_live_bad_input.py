"""Every bad input to the page API, against a real server with the real SmolLM2 model
(ENGINE=llamacpp: "prompt over the model's context" is the real model's context), on SQLite and
PostgreSQL.

Each case checks the status code (404 for another user's ids, exactly like missing ones, never 403),
that the answer says what is wrong, and that nothing was written: the row counts are the same
before and after and no reply is left `streaming`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.live_server import LiveServer, PageClient, read_stream, row_counts

MAX_MESSAGE_CHARS = 16000  # the default
OVER_CONTEXT = "7 " * 7000  # 14000 characters: well under the size limit, far over 2048 tokens


@dataclass(frozen=True)
class World:
    alice: PageClient
    anonymous: PageClient
    conversation: str  # alice's, still empty
    alices_message: str  # a finished reply in another of alice's conversations
    bobs_conversation: str
    bobs_message: str


@pytest.fixture(scope="module")
def world(server: LiveServer, alice: PageClient, bob: PageClient) -> Iterator[World]:
    replies = []
    for client in (alice, bob):
        with client.send(client.new_conversation(), "Hi.", max_tokens=4, temperature=0) as response:
            reply = read_stream(response)
        client.wait_final(reply.start["conversation_id"], reply.message_id)
        replies.append(reply)
    alices, bobs = replies
    anonymous = PageClient(server.url)
    yield World(
        alice=alice,
        anonymous=anonymous,
        conversation=alice.new_conversation(),
        alices_message=alices.message_id,
        bobs_conversation=bobs.start["conversation_id"],
        bobs_message=bobs.message_id,
    )
    anonymous.close()


def send(w: World, conversation: str | None = None, **body: object) -> httpx.Response:
    """POST a message as alice and read the whole answer."""
    return w.alice.post(
        f"/api/conversations/{conversation or w.conversation}/messages",
        {"content": "Hello!", "max_tokens": 4, **body},
    )


CASES: dict[str, tuple[Callable[[World], httpx.Response], int, str]] = {
    # name: (request, expected status, a word the error must contain)
    "malformed-json": (
        lambda w: w.alice.http.post(
            f"/api/conversations/{w.conversation}/messages",
            content=b'{"content": "Hello!", ',
            headers={**w.alice.csrf_headers(), "content-type": "application/json"},
        ),
        400,
        "",
    ),
    "content-missing": (
        lambda w: w.alice.post(f"/api/conversations/{w.conversation}/messages", {}),
        400,
        "content",
    ),
    "unknown-field": (lambda w: send(w, colour="blue"), 400, "colour"),
    "unknown-conversation": (lambda w: send(w, str(uuid.uuid4())), 404, "conversation"),
    "others-conversation-send": (lambda w: send(w, w.bobs_conversation), 404, "conversation"),
    "others-conversation-read": (
        lambda w: w.alice.http.get(f"/api/conversations/{w.bobs_conversation}"),
        404,
        "conversation",
    ),
    "others-conversation-delete": (
        lambda w: w.alice.http.delete(
            f"/api/conversations/{w.bobs_conversation}", headers=w.alice.csrf_headers()
        ),
        404,
        "conversation",
    ),
    "others-message-stream": (
        lambda w: w.alice.http.get(f"/api/messages/{w.bobs_message}/stream"),
        404,
        "message",
    ),
    "others-message-cancel": (lambda w: w.alice.cancel(w.bobs_message), 404, "message"),
    "unknown-message-stream": (
        lambda w: w.alice.http.get(f"/api/messages/{uuid.uuid4()}/stream"),
        404,
        "message",
    ),
    "bad-last-event-id": (
        lambda w: w.alice.http.get(
            f"/api/messages/{w.alices_message}/stream", headers={"Last-Event-ID": "soon"}
        ),
        400,
        "last-event-id",
    ),
    "negative-after": (
        lambda w: w.alice.http.get(f"/api/messages/{w.alices_message}/stream?after=-1"),
        400,
        "after",
    ),
    "empty-message": (lambda w: send(w, content=" \n\t "), 400, "empty"),
    "oversized-message": (
        lambda w: send(w, content="a" * (MAX_MESSAGE_CHARS + 1)),
        400,
        "limit",
    ),
    "prompt-over-context": (lambda w: send(w, content=OVER_CONTEXT), 400, "context"),
    "temperature-5": (lambda w: send(w, temperature=5), 400, "temperature"),
    "max-tokens-0": (lambda w: send(w, max_tokens=0), 400, "max_tokens"),
    "max-tokens-over-context": (lambda w: send(w, max_tokens=10**6), 400, "max_tokens"),
    "top-p-0": (lambda w: send(w, top_p=0), 400, "top_p"),
    "five-stop-strings": (lambda w: send(w, stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    "missing-csrf-send": (
        lambda w: w.alice.http.post(
            f"/api/conversations/{w.conversation}/messages", json={"content": "Hello!"}
        ),
        403,
        "csrf",
    ),
    "missing-csrf-new-conversation": (
        lambda w: w.alice.http.post("/api/conversations", json={}),
        403,
        "csrf",
    ),
    "not-logged-in-send": (
        lambda w: w.anonymous.post(
            f"/api/conversations/{w.conversation}/messages", {"content": "Hello!"}
        ),
        401,
        "log in",
    ),
    "not-logged-in-list": (lambda w: w.anonymous.http.get("/api/conversations"), 401, "log in"),
    "not-logged-in-stream": (
        lambda w: w.anonymous.http.get(f"/api/messages/{w.bobs_message}/stream"),
        401,
        "log in",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_and_writes_nothing(
    case: str, world: World, live_database_url: str
) -> None:
    """The request is refused with the right status and a clear reason, and the database is
    exactly as it was: no conversation, message or half-written `streaming` reply appears, and
    the conversation keeps its title."""
    request, status, word = CASES[case]
    before = row_counts(live_database_url)

    response = request(world)

    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert response.json()["detail"], response.text
    assert word.lower() in response.text.lower(), response.text  # in the detail or its `extra`
    after = row_counts(live_database_url)
    assert after == before
    assert after["streaming"] == 0
    assert world.alice.conversation(world.conversation)["title"] == "New chat"


def test_the_same_requests_succeed_when_fixed(world: World, live_database_url: str) -> None:
    """The control: a good message in the same conversation streams and writes two rows."""
    before = row_counts(live_database_url)
    with world.alice.send(world.conversation, "Hello!", max_tokens=4, temperature=0) as response:
        record = read_stream(response)
    world.alice.wait_final(world.conversation, record.message_id)
    after = row_counts(live_database_url)
    assert after["messages"] == before["messages"] + 2
    assert after["streaming"] == 0
