"""One user cannot starve the others: a cap on each user's live replies, fair engine admission.

Against a real server with the synthetic engine (10 ms steps, 2 engine slots, at most 3 live
replies per user), on SQLite and PostgreSQL. Replies of `[[synthetic:tokens=100000]]` run until
they are cancelled, so which replies hold the engine's slots is known at every moment.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from tests.live_server import LiveServer, PageClient, query, read_stream, uuid_text
from tests.serving.test_live_websocket import open_socket, receive, send_json

CAP = 3
ENDLESS = "[[synthetic:tokens=100000]] Go on."


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10, "ENGINE_MAX_SEQS": 2, "MAX_REPLIES_PER_USER": CAP}


class Frames:
    """A socket's frames, sorted by reply (client_ref -> message id) as they arrive."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.message_of: dict[str, str] = {}  # client_ref -> message id
        self.by_message: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.rejected: dict[str | None, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []

    def deltas(self, ref: str) -> int:
        frames = self.by_message.get(self.message_of.get(ref, ""), [])
        return sum(1 for f in frames if f["type"] == "delta")

    def ended(self, ref: str) -> bool:
        frames = self.by_message.get(self.message_of.get(ref, ""), [])
        return any(f["type"] in ("final", "error") for f in frames)

    def until(self, done: Callable[[], bool], timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"timed out; last frames: {self.log[-5:]}"
            frame = receive(self.ws, timeout_s)
            self.log.append(frame)
            if frame["type"] == "start":
                self.message_of[frame["client_ref"]] = frame["message_id"]
                self.by_message[frame["message_id"]].append(frame)
            elif frame["type"] == "rejected":
                self.rejected[frame["client_ref"]] = frame
            elif "message_id" in frame:
                self.by_message[frame["message_id"]].append(frame)

    def send(self, ref: str, conversation_id: str, content: str, **extra: Any) -> None:
        send_json(self.ws, {"type": "send", "conversation_id": conversation_id,
                            "client_ref": ref, "content": content, **extra})  # fmt: skip

    def cancel(self, ref: str) -> None:
        send_json(self.ws, {"type": "cancel", "message_id": self.message_of[ref]})


def first_token_at(database_url: str, message_id: str) -> datetime | None:
    rows = query(database_url, "SELECT id, first_token_at FROM messages")
    (value,) = [r["first_token_at"] for r in rows if uuid_text(r["id"]) == message_id]
    # a datetime (PostgreSQL) or its text (SQLite)
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def test_over_the_cap_a_send_is_refused_on_every_transport_and_nothing_else_is(
    server: LiveServer, bob: PageClient
) -> None:
    """Bob's 4th live reply is refused: a `rejected` frame (429) on his socket while his other
    three keep streaming, a 429 from the page API, a 429 in OpenAI's error shape from /v1, and
    nothing stored for the refused ones. Once his replies end he may send again."""
    key = bob.post("/api/keys", {"name": "cap"}).json()["secret"]
    conversations = [bob.new_conversation() for _ in range(CAP + 1)]
    with open_socket(server, bob) as ws:
        frames = Frames(ws)
        for i, conversation in enumerate(conversations):
            frames.send(f"r{i}", conversation, ENDLESS, max_tokens=2000)
        frames.until(lambda: len(frames.message_of) == CAP and "r3" in frames.rejected)
        rejected = frames.rejected["r3"]
        assert rejected["status"] == 429
        assert f"{CAP} replies in progress" in rejected["error"]
        seen = frames.deltas("r0")
        frames.until(lambda: frames.deltas("r0") >= seen + 3)  # the others still stream

        with bob.send(conversations[3], "one more") as response:
            assert response.status_code == 429
            assert f"{CAP} replies in progress" in response.read().decode()
        api = httpx.post(
            f"{server.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "synthetic", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert api.status_code == 429, api.text
        error = api.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "replies in progress" in error["message"]
        assert bob.conversation(conversations[3])["messages"] == []  # nothing half-written

        for ref in ("r0", "r1", "r2"):
            frames.cancel(ref)
        frames.until(lambda: all(frames.ended(r) for r in ("r0", "r1", "r2")))

    for conversation, ref in zip(conversations, ("r0", "r1", "r2"), strict=False):
        assert bob.wait_final(conversation, frames.message_of[ref])["status"] == "cancelled"
    deadline = time.monotonic() + 10
    while True:  # the count drops once each reply's end is saved
        with bob.send(conversations[3], "[[synthetic:tokens=3]] again") as response:
            if response.status_code == 200:
                assert read_stream(response).end is not None
                break
        assert time.monotonic() < deadline, "still refused after every reply ended"
        time.sleep(0.1)


def test_another_users_reply_goes_before_a_users_backlog(
    server: LiveServer, live_database_url: str, alice: PageClient, bob: PageClient
) -> None:
    """Bob holds both engine slots and has a third reply waiting; Alice sends one. When a slot
    frees, Alice's goes in, not Bob's waiting one (first come, first served would run Bob's and
    leave Alice waiting for as long as his replies last)."""
    bob_conversations = [bob.new_conversation() for _ in range(CAP)]
    alice_conversation = alice.new_conversation()
    with open_socket(server, bob) as bob_ws, open_socket(server, alice) as alice_ws:
        bobs = Frames(bob_ws)
        for i, conversation in enumerate(bob_conversations):
            bobs.send(f"b{i}", conversation, ENDLESS, max_tokens=2000)
        bobs.until(lambda: len(bobs.message_of) == CAP and bobs.deltas("b0") * bobs.deltas("b1"))
        assert bobs.deltas("b2") == 0  # b2 waits for a slot

        alices = Frames(alice_ws)
        alices.send("a", alice_conversation, "[[synthetic:tokens=20]] Hi", max_tokens=50)
        alices.until(lambda: "a" in alices.message_of)
        assert alice.engine_stats()["waiting"] == 2  # b2, then a
        bobs.cancel("b0")
        alices.until(lambda: alices.ended("a"), timeout_s=10)
        bobs.cancel("b1")
        bobs.cancel("b2")
        bobs.until(lambda: all(bobs.ended(r) for r in ("b0", "b1", "b2")))

    alice_first = first_token_at(live_database_url, alices.message_of["a"])
    b2_first = first_token_at(live_database_url, bobs.message_of["b2"])
    assert alice_first is not None
    assert b2_first is None or b2_first > alice_first
