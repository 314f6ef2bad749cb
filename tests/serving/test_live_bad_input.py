"""Every bad input to the page API, against a real server with the real SmolLM2 model
(ENGINE=llamacpp: "prompt over the model's context" is the real model's context), on SQLite and
PostgreSQL.

Each case checks the status code (404 for another user's ids, exactly like missing ones, never 403),
that the answer says what is wrong, and that nothing was written: the row counts are the same
before and after and no reply is left `streaming`.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.live_server import (
    LiveServer,
    PageClient,
    query,
    read_stream,
    row_counts,
    uuid_text,
)

MAX_MESSAGE_CHARS = 16000  # the default
# Under the size limit, over the 8,192 tokens SmolLM2 sees (a token or more per character)
OVER_CONTEXT = "猫" * 12000
DEEP = 100_000
DEEPLY_NESTED = b'{"content": "Hello!", "stop": ' + b"[" * DEEP + b"]" * DEEP + b"}"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    """Short replies; and no per-user cap: the race tests below start 30 replies at once for one
    user, which the cap (MAX_REPLIES_PER_USER, tested in test_live_fairness.py) would otherwise
    refuse with 429 before they could race their deletes."""
    return {"DEFAULT_MAX_TOKENS": 32, "MAX_REPLIES_PER_USER": 0}


def raw_post(w: World, path: str, body: bytes) -> httpx.Response:
    """POST a body exactly as given (JSON that a JSON encoder would never write), as alice."""
    return w.alice.http.post(
        path, content=body, headers={**w.alice.csrf_headers(), "content-type": "application/json"}
    )


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
    "deeply-nested-json": (
        lambda w: raw_post(w, f"/api/conversations/{w.conversation}/messages", DEEPLY_NESTED),
        400,
        "nested too deeply",
    ),
    "deeply-nested-json-new-conversation": (
        lambda w: raw_post(
            w, "/api/conversations", b'{"title": ' + b"[" * DEEP + b"]" * DEEP + b"}"
        ),
        400,
        "nested too deeply",
    ),
    "lone-surrogate": (
        lambda w: raw_post(
            w, f"/api/conversations/{w.conversation}/messages", b'{"content": "\\ud800 Hello!"}'
        ),
        400,
        "surrogate",
    ),
    "nul-character": (lambda w: send(w, content="Hello\u0000!"), 400, "nul"),
    "nul-character-in-a-stop-string": (lambda w: send(w, stop=["\u0000"]), 400, "nul"),
    "nul-character-in-a-title": (
        lambda w: w.alice.post("/api/conversations", {"title": "a\u0000b"}),
        400,
        "nul",
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


# -- the WebSocket: one bad frame, one `rejected` answer; the socket and its replies carry on -----


@pytest.fixture(scope="module", params=["llamacpp", "synthetic"])
def socket_engine(
    request: pytest.FixtureRequest, server_pool: Any, backend: str
) -> tuple[str, LiveServer, PageClient]:
    """A server of each engine on this backend (the module's own for llamacpp; test_live_websocket's
    synthetic one), with a signed-up user."""
    engine = request.param
    overrides = {"DEFAULT_MAX_TOKENS": 32} if engine == "llamacpp" else {"SYNTHETIC_STEP_MS": 10}
    pooled = server_pool.get(backend, engine, overrides)
    client = pooled.alice
    if client is None:
        client = pooled.alice = PageClient(pooled.server.url)
        client.signup(f"alice-{secrets.token_hex(4)}@example.com")
    return engine, pooled.server, client


def long_request(engine: str) -> dict[str, object]:
    """A reply that streams for a few seconds on either engine."""
    if engine == "synthetic":
        return {"content": "[[synthetic:tokens=300]] Tell me everything.", "max_tokens": 400}
    return {"content": "Write a long story about a dragon.", "max_tokens": 48, "temperature": 0}


def socket_headers(client: PageClient) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in client.http.cookies.items())}


def test_bad_frames_are_rejected_one_by_one_while_a_reply_streams_on(
    socket_engine: tuple[str, LiveServer, PageClient],
) -> None:
    """With a long reply streaming on the socket, each bad frame (nested 100,000 deep, a send with
    a lone surrogate or a NUL character, not JSON, binary) gets exactly one `rejected` frame
    (status 400, the send's client_ref echoed, the reason named) and nothing else happens: the
    socket stays open, the reply streams on to its end and is stored whole, and the refused sends
    wrote nothing."""
    engine, server, client = socket_engine
    conversation = client.new_conversation()
    deep = '{"type": "send", "x": ' + "[" * DEEP + "]" * DEEP + "}"

    def bad_send(ref: str, content: str) -> str:
        # Written by hand: json.dumps would escape the surrogate the same way, but says less.
        return (
            f'{{"type": "send", "conversation_id": "{conversation}", "client_ref": "{ref}",'
            f' "content": "{content}"}}'
        )

    bad: list[tuple[str | bytes, str | None, str]] = [
        (deep, None, "nested too deeply"),
        (bad_send("surrogate", "\\ud800 Hello"), "surrogate", "surrogate"),
        (bad_send("nul", "Hello \\u0000"), "nul", "nul"),
        ("this is not json", None, "json object"),
        (b"\x00\x01", None, "binary"),
    ]
    with connect(server.ws_url, additional_headers=socket_headers(client), open_timeout=10) as ws:
        ws.send(
            json.dumps({"type": "send", "conversation_id": conversation, **long_request(engine)})
        )
        frames: list[dict[str, object]] = []  # the reply's
        rejected: list[dict[str, object]] = []
        deltas_after_the_last_rejection = 0

        def read_one() -> None:
            nonlocal deltas_after_the_last_rejection
            frame = json.loads(ws.recv(timeout=60))
            if frame["type"] == "rejected":
                rejected.append(frame)
                deltas_after_the_last_rejection = 0
            elif frame["type"] != "ping":
                frames.append(frame)
                deltas_after_the_last_rejection += frame["type"] == "delta"

        while not any(f["type"] == "delta" for f in frames):
            read_one()
        for frame, _, _ in bad:
            ws.send(frame)
        while len(rejected) < len(bad) or frames[-1]["type"] not in ("final", "error"):
            read_one()
        text = "".join(str(f["text"]) for f in frames if f["type"] == "delta")

    assert len(rejected) == len(bad), rejected
    for (_, ref, word), frame in zip(bad, rejected, strict=True):
        assert frame["status"] == 400, frame
        assert frame["client_ref"] == ref, frame
        assert word in str(frame["error"]).lower(), frame
    end = frames[-1]
    assert end["type"] == "final" and end["status"] in ("completed", "length"), end
    assert deltas_after_the_last_rejection > 0, "the reply did not stream on after the rejections"
    stored = client.message(conversation, str(frames[0]["message_id"]))
    assert stored["status"] == end["status"] and stored["content"] == text
    assert len(client.conversation(conversation)["messages"]) == 2  # the refused sends wrote none


# -- a send or a regenerate racing the delete of its conversation ---------------------------------

RACES = 30


def finished_reply(client: PageClient, conversation: str) -> str:
    with client.send(conversation, "Hi.", max_tokens=2, temperature=0) as response:
        reply = read_stream(response)
    client.wait_final(conversation, reply.message_id)
    return reply.message_id


@pytest.mark.parametrize("action", ["send", "regenerate"])
def test_a_request_racing_a_delete_is_a_4xx_or_a_reply_never_a_500(
    world: World, server: LiveServer, live_database_url: str, action: str
) -> None:
    """30 conversations, each sent a message (or asked to regenerate its reply) and deleted at
    (nearly) the same moment: every delete answers 204; every send or regenerate answers 404 (or,
    for a regenerate, 409) or streams a reply to its end; nothing answers 500 or logs a traceback;
    and the deleted conversations leave no rows behind, `streaming` or otherwise."""
    conversations = [world.alice.new_conversation() for _ in range(RACES)]
    if action == "send":
        paths = [f"/api/conversations/{c}/messages" for c in conversations]
        body: dict[str, object] = {"content": "Hi.", "max_tokens": 4}
        refusals = {404: "no such conversation"}
    else:
        replies = [finished_reply(world.alice, c) for c in conversations]
        paths = [f"/api/messages/{m}/regenerate" for m in replies]
        body = {"max_tokens": 4}
        # A 409 too: on SQLite the reads before the write see the delete half-done (the
        # conversation there, its messages gone: "no question before this reply").
        refusals = {404: "no such message", 409: '"detail":'}
    cookies = dict(world.alice.http.cookies)
    csrf = world.alice.csrf_headers()

    # One connected client per request, made beforehand; all start together at the barrier.
    clients = [
        httpx.Client(base_url=server.url, cookies=cookies, timeout=60) for _ in range(2 * RACES)
    ]
    for http in clients:
        http.get("/healthz").raise_for_status()
    barrier = threading.Barrier(2 * RACES)

    def start(http: httpx.Client, path: str, delay_s: float) -> tuple[int, str]:
        barrier.wait()
        time.sleep(delay_s)
        with http.stream("POST", path, json=body, headers=csrf) as response:
            return response.status_code, response.read().decode()

    def delete(http: httpx.Client, conversation: str, delay_s: float) -> int:
        barrier.wait()
        time.sleep(delay_s)
        return http.delete(f"/api/conversations/{conversation}", headers=csrf).status_code

    # The delete starts from 45 ms before its request to 42 ms after it, 3 ms apart: some land
    # before the request's lookup, some between its lookup and its write, some after.
    offsets = [(i - RACES // 2) * 0.003 for i in range(RACES)]
    with ThreadPoolExecutor(max_workers=2 * RACES) as pool:
        requests = [
            pool.submit(start, clients[i], path, max(0.0, -offsets[i]))
            for i, path in enumerate(paths)
        ]
        deletes = [
            pool.submit(delete, clients[RACES + i], c, max(0.0, offsets[i]))
            for i, c in enumerate(conversations)
        ]
        results = [f.result() for f in requests]
        delete_statuses = [f.result() for f in deletes]
    for http in clients:
        http.close()

    assert delete_statuses == [204] * RACES
    for status, text in results:
        assert status == 200 or status in refusals, (status, text)
        if status in refusals:
            assert refusals[status] in text, text
        else:
            assert "event: final" in text or "event: error" in text, text
    world.alice.wait_engine_idle(timeout_s=60)
    remaining = {
        uuid_text(row["id"]) for row in query(live_database_url, "SELECT id FROM conversations")
    }
    assert remaining.isdisjoint(conversations)
    assert row_counts(live_database_url)["streaming"] == 0
    assert (
        query(
            live_database_url,
            "SELECT count(*) AS n FROM messages m"
            " LEFT JOIN conversations c ON c.id = m.conversation_id WHERE c.id IS NULL",
        )[0]["n"]
        == 0
    )
    log = server.log_since_mark()
    assert "Traceback" not in log and " 500 " not in log, log[-4000:]


# -- /v1 ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_key(world: World) -> str:
    response = world.alice.post("/api/keys", {"name": "bad input"})
    assert response.status_code == 201, response.text
    return response.json()["secret"]


@pytest.mark.parametrize(
    ("body", "status", "word"),
    [
        (  # an unknown field (ignored, but still decoded)
            b'{"model": "m", "messages": [], "x": ' + b"[" * DEEP + b"]" * DEEP + b"}",
            400,
            "nested too deeply",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800 hi"}]}',
            400,
            "surrogate",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi \\u0000"}]}', 400, "nul"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', 404, "does not exist"),
        (  # OpenAI's `user` field, named like a dependency once (Litestar then answered 500)
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": false}',
            400,
            "user",
        ),
    ],
    ids=["deeply-nested", "lone-surrogate", "nul-character", "unknown-model", "user-not-a-string"],
)
def test_bad_bodies_on_v1_are_4xx_in_openais_shape(
    server: LiveServer, api_key: str, live_database_url: str, body: bytes, status: int, word: str
) -> None:
    """Each is refused with a 4xx in OpenAI's error shape that names the problem, nothing is
    written, and the server logs no traceback (a client's mistake is not an uncaught error)."""
    before = row_counts(live_database_url)
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {api_key}", "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and word in error["message"].lower(), error
    assert row_counts(live_database_url) == before
    log = server.log_since_mark()
    assert "Traceback" not in log and "Uncaught exception" not in log, log


# -- a client that leaves while its body is being read --------------------------------------------

CLIENT_LEFT = "the client left while its body was being read"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "page"])
def test_a_client_leaving_mid_body_is_quiet(
    world: World, server: LiveServer, api_key: str, path: str
) -> None:
    """A client that announces a 1000-byte body, sends 10 bytes and closes the connection: the
    server logs one line saying so, and no traceback and no 500; it then serves the next request."""
    if path == "page":
        path = f"/api/conversations/{world.conversation}/messages"
        auth = (
            f"Cookie: {'; '.join(f'{k}={v}' for k, v in world.alice.http.cookies.items())}\r\n"
            f"x-csrftoken: {world.alice.csrf_headers()['x-csrftoken']}\r\n"
        )
    else:
        auth = f"Authorization: Bearer {api_key}\r\n"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"model": ')
    deadline = time.monotonic() + 30
    while CLIENT_LEFT not in (log := server.log_since_mark()) and "Traceback" not in log:
        assert time.monotonic() < deadline, f"the server never noticed:\n{log}"
        time.sleep(0.05)
    assert "Traceback" not in log and " 500 " not in log, log
    assert log.count(CLIENT_LEFT) == 1, log
    assert world.alice.http.get("/api/conversations").status_code == 200


# -- the admin console's filters --------------------------------------------------------------------


@pytest.mark.parametrize(
    "query_string",
    [
        "page=100000000000000000000",
        "page=-5",
        "date_to=9999-12-31",
        "date_from=9999-12-31",
        "date_from=0001-01-01&date_to=0001-01-01",
    ],
)
def test_admin_filters_out_of_range_are_clamped(world: World, query_string: str) -> None:
    """Pages past the end show the last page, dates at the ends of the calendar filter as far
    as they can: a page, never a 500."""
    response = world.alice.http.get(f"/admin/?{query_string}")
    assert response.status_code == 200, response.text
    assert "page" in response.text.lower()


def test_admin_search_with_a_nul_character_is_a_400(world: World) -> None:
    response = world.alice.http.get("/admin/?q=a%00b")
    assert response.status_code == 400, response.text
    assert "nul" in response.text.lower()
