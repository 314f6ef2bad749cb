"""The page's WebSocket (`/ws`) against a real server with the synthetic engine (ENGINE=synthetic,
10 ms steps), on SQLite and PostgreSQL.

The synthetic engine gives replies of an exact length (`[[synthetic:tokens=N]]`) at a steady pace,
so a cancel or a drop reliably lands mid-reply. The protocol itself (send, cancel, resume, garbage
frames) does not depend on the model.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.live_server import LiveServer, PageClient, row_counts

LONG = "[[synthetic:tokens=100000]] Tell me everything."
PAGE_GRACE_S = 2.0  # BASE_ENV's PAGE_GRACE_S


@pytest.fixture(scope="module", params=["synthetic", "trtllm-fake"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    """The synthetic engine, and the TensorRT-LLM adapter over the FAKE `tensorrt_llm`
    (tests/fakes/tensorrt_llm/: TensorRT-LLM needs a GPU)."""
    return request.param


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10}


@contextlib.contextmanager
def open_socket(
    server: LiveServer, client: PageClient | None, **kwargs: Any
) -> Iterator[ClientConnection]:
    """A WebSocket carrying `client`'s session cookie (none for None)."""
    headers = {}
    if client is not None:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in client.http.cookies.items())
    with connect(server.ws_url, additional_headers=headers, open_timeout=10, **kwargs) as ws:
        yield ws


def send_json(ws: ClientConnection, payload: dict[str, Any]) -> None:
    ws.send(json.dumps(payload))


def receive(ws: ClientConnection, timeout_s: float = 15.0) -> dict[str, Any]:
    frame = ws.recv(timeout=timeout_s)
    assert isinstance(frame, str), frame
    return json.loads(frame)


@dataclass
class WsReply:
    """The frames of one reply on a socket."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    @property
    def start(self) -> dict[str, Any]:
        assert self.frames and self.frames[0]["type"] == "start", self.frames[:1]
        return self.frames[0]

    @property
    def deltas(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == "delta"]

    @property
    def text(self) -> str:
        return "".join(f["text"] for f in self.deltas)

    @property
    def end(self) -> dict[str, Any] | None:
        return (
            self.frames[-1]
            if self.frames and self.frames[-1]["type"] in ("final", "error")
            else None
        )

    def read(self, ws: ClientConnection, *, until_deltas: int | None = None) -> WsReply:
        """Read frames (pings skipped) to the end, or until `until_deltas` deltas are in."""
        while self.end is None:
            if until_deltas is not None and len(self.deltas) >= until_deltas:
                return self
            frame = receive(ws)
            if frame["type"] == "ping":
                continue
            assert frame["type"] in ("start", "delta", "final", "error"), frame
            self.frames.append(frame)
            self.times.append(time.monotonic())
        assert until_deltas is None, f"the reply ended after {len(self.deltas)} deltas"
        return self


def assert_offsets(reply: WsReply, start_offset: int = 0) -> None:
    offset = start_offset
    for frame in reply.deltas:
        offset += len(frame["text"])
        assert frame["id"] == offset, (frame, offset)


def test_send_streams_start_deltas_and_final(server: LiveServer, alice: PageClient) -> None:
    """`send` answers with a `start` echoing the client_ref, deltas whose ids are character
    offsets, arriving over time, and a `completed` final; the stored reply is the streamed text."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation, "client_ref": "ref-1",
                       "content": "[[synthetic:tokens=60]] Hi", "max_tokens": 100, "seed": 1})  # fmt: skip
        reply = WsReply().read(ws)

    start = reply.start
    assert start["client_ref"] == "ref-1" and start["conversation_id"] == conversation
    assert start["offset"] == 0 and start["user_message_id"]
    assert reply.end is not None and reply.end["type"] == "final"
    assert reply.end["status"] == "completed"
    assert reply.end["usage"]["completion_tokens"] == 60
    assert reply.end["id"] == len(reply.text)
    assert len(reply.deltas) >= 10
    assert reply.times[-1] - reply.times[1] > 0.2, "the deltas came in one burst"
    assert_offsets(reply)
    stored = alice.wait_final(conversation, start["message_id"])
    assert stored["content"] == reply.text and stored["status"] == "completed"


def test_regenerate_streams_a_new_reply_in_the_old_ones_place(
    server: LiveServer, alice: PageClient
) -> None:
    """`regenerate` answers the latest reply's question again on the socket: a `start` echoing
    the client_ref, for a new message answering the same user message, then deltas and a final;
    the conversation then shows the new reply where the old was (the old one is its other
    version). An earlier reply (one with a turn after it) is refused with a `rejected` frame
    (409, the client_ref echoed), and nothing changes."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation,
                       "content": "[[synthetic:tokens=20]] Hi", "max_tokens": 50})  # fmt: skip
        first = WsReply().read(ws)
        send_json(ws, {"type": "regenerate", "message_id": first.start["message_id"],
                       "client_ref": "again", "max_tokens": 50})  # fmt: skip
        again = WsReply().read(ws)
        assert again.start["client_ref"] == "again"
        assert again.start["message_id"] != first.start["message_id"]
        assert again.start["user_message_id"] == first.start["user_message_id"]
        assert again.end is not None and again.end["status"] == "completed"
        assert_offsets(again)

        send_json(ws, {"type": "send", "conversation_id": conversation,
                       "content": "[[synthetic:tokens=5]] More", "max_tokens": 50})  # fmt: skip
        later = WsReply().read(ws)
        send_json(ws, {"type": "regenerate", "message_id": again.start["message_id"],
                       "client_ref": "stale"})  # fmt: skip
        rejected = receive(ws)
        while rejected["type"] == "ping":
            rejected = receive(ws)
    assert rejected["type"] == "rejected" and rejected["client_ref"] == "stale"
    assert rejected["status"] == 409 and "latest" in rejected["error"]
    messages = alice.conversation(conversation)["messages"]
    assert [m["id"] for m in messages] == [
        first.start["user_message_id"],
        again.start["message_id"],
        later.start["user_message_id"],
        later.start["message_id"],
    ]
    assert messages[1]["content"] == again.text
    assert messages[1]["siblings"] == [first.start["message_id"], again.start["message_id"]]


def test_cancel_mid_stream_lands(server: LiveServer, alice: PageClient) -> None:
    """A `cancel` sent while the reply streams (on the same socket) stops it: the reply's own
    stream ends with a `cancelled` final, the stored text is exactly what the socket delivered,
    and the engine is freed."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation, "content": LONG,
                       "max_tokens": 2000})  # fmt: skip
        reply = WsReply().read(ws, until_deltas=5)
        send_json(ws, {"type": "cancel", "message_id": reply.start["message_id"]})
        reply.read(ws)

    assert reply.end is not None and reply.end["status"] == "cancelled"
    stored = alice.wait_final(conversation, reply.start["message_id"])
    assert stored["status"] == "cancelled"
    assert stored["content"] == reply.text
    assert stored["completion_tokens"] < 2000
    assert alice.engine_stats()["running"] == 0


def test_resume_over_a_new_socket_after_a_drop(server: LiveServer, alice: PageClient) -> None:
    """Close the socket mid-reply, open another and `resume` from the last id: the text before
    plus after is exactly the stored reply; a finished reply resumes to its end likewise."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation,
                       "content": "[[synthetic:tokens=150]] Go", "max_tokens": 200})  # fmt: skip
        first = WsReply().read(ws, until_deltas=5)
    message_id, last_id = first.start["message_id"], first.deltas[-1]["id"]

    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "resume", "message_id": message_id, "after": last_id})
        second = WsReply().read(ws)
        assert second.start["offset"] == last_id
        assert_offsets(second, start_offset=last_id)
        stored = alice.wait_final(conversation, message_id)
        assert first.text + second.text == stored["content"]
        assert second.end is not None and second.end["status"] == "completed"

        send_json(ws, {"type": "resume", "message_id": message_id, "after": 7})  # finished now
        replay = WsReply().read(ws)
        assert replay.text == stored["content"][7:]
        assert replay.end is not None and replay.end["status"] == "completed"


def test_a_closed_socket_is_disconnected_after_the_grace(
    server: LiveServer, alice: PageClient
) -> None:
    """Closing the socket mid-reply is a drop like any other: the reply goes on for the page
    grace, then ends `disconnected`, holding at least what the socket delivered, engine freed."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation, "content": LONG,
                       "max_tokens": 2000})  # fmt: skip
        reply = WsReply().read(ws, until_deltas=3)
    closed_at = time.time()

    stored = alice.wait_final(conversation, reply.start["message_id"])
    assert stored["status"] == "disconnected"
    finished_at = datetime.fromisoformat(stored["finished_at"]).timestamp()
    assert finished_at - closed_at >= PAGE_GRACE_S * 0.8
    assert stored["content"].startswith(reply.text)
    assert alice.wait_engine_idle(timeout_s=5)["running"] == 0


def close_frame(ws: ClientConnection) -> tuple[int, str]:
    """Wait for the server to close the socket; its close code and reason."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None, "the server did not send a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.mark.parametrize(
    ("frame", "word"),
    [
        ("this is not json", "json object"),
        ("[1, 2, 3]", "json object"),
        ('"a string"', "json object"),
        (b"\x00\x01", "binary"),
    ],
    ids=["not-json", "json-array", "json-string", "binary"],
)
def test_garbage_frames_are_rejected_and_the_socket_stays_open(
    server: LiveServer, alice: PageClient, frame: str | bytes, word: str
) -> None:
    """A text frame that is not a JSON object, or a binary frame, gets one `rejected` frame (400,
    with the reason); the same socket then still serves a valid request."""
    conversation = alice.new_conversation()
    with open_socket(server, alice) as ws:
        ws.send(frame)
        rejected = receive(ws)
        assert rejected["type"] == "rejected" and rejected["status"] == 400, rejected
        assert word in rejected["error"].lower(), rejected
        send_json(ws, {"type": "send", "conversation_id": conversation,
                       "content": "[[synthetic:tokens=5]] ok", "max_tokens": 10})  # fmt: skip
        reply = WsReply().read(ws)
    assert reply.end is not None and reply.end["status"] == "completed"


def test_requests_it_cannot_serve_are_rejected_and_the_socket_stays_open(
    server: LiveServer, alice: PageClient, bob: PageClient, live_database_url: str
) -> None:
    """An unknown type, a malformed or unservable send, and a foreign or unknown message id each
    get a `rejected` frame (404 for ids that are not yours, 400 for bad input) and write nothing;
    the same socket then still serves a valid request."""
    bobs_conversation = bob.new_conversation()
    conversation = alice.new_conversation()
    before = row_counts(live_database_url)

    def send(conversation_id: str = conversation, **fields: Any) -> dict[str, Any]:
        return {"type": "send", "conversation_id": conversation_id, "content": "hi", **fields}

    bad: list[tuple[dict[str, Any], int | None, str]] = [
        ({"type": "dance"}, None, "dance"),
        ({"no_type": True}, None, "None"),
        (send(content="   "), 400, "empty"),
        (send(temperature=5), 400, "temperature"),
        (send(max_tokens=0), 400, "max_tokens"),
        (send(top_p=0), 400, "top_p"),
        (send(content="x" * 16001), 400, "limit"),
        ({"type": "send", "conversation_id": conversation}, None, "content"),
        (send(bobs_conversation), 404, "conversation"),
        (send(str(uuid.uuid4())), 404, "conversation"),
        ({"type": "cancel", "message_id": str(uuid.uuid4())}, 404, "message"),
        ({"type": "resume", "message_id": "not-a-uuid"}, None, "resume"),
    ]
    with open_socket(server, alice) as ws:
        for request, status, word in bad:
            ref = "r" if request.get("type") == "send" else None  # only sends carry a client_ref
            send_json(ws, request if ref is None else {**request, "client_ref": ref})
            frame = receive(ws)
            assert frame["type"] == "rejected", (request, frame)
            assert frame.get("status") == status, (request, frame)
            assert word.lower() in frame["error"].lower(), (request, frame)
            assert frame["client_ref"] == ref
        assert row_counts(live_database_url) == before

        send_json(ws, send(content="[[synthetic:tokens=5]] ok", max_tokens=10))
        reply = WsReply().read(ws)
        assert reply.end is not None and reply.end["status"] == "completed"


def test_a_socket_without_a_session_or_from_another_site_is_closed(
    server: LiveServer, alice: PageClient
) -> None:
    """No session: closed with 4401; a cross-site Origin (even with a valid cookie): 1008."""
    with open_socket(server, None) as ws:
        assert close_frame(ws)[0] == 4401
    with open_socket(server, alice, origin="http://evil.example") as ws:  # type: ignore[arg-type]
        assert close_frame(ws)[0] == 1008
