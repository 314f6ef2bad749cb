"""Keepalives when a stream is idle, against a real server with a deliberately slow synthetic
engine (ENGINE=synthetic, one token per 1.5 s step) and KEEPALIVE_S=0.25, on SQLite and PostgreSQL.

Between tokens nothing happens for 1.5 s: the SSE stream must fill the silence with `: keepalive`
comments (which proxies and browsers need to keep the connection), and the WebSocket with `ping`
frames, without changing the reply itself.
"""

from __future__ import annotations

import json
import time
from itertools import pairwise

import pytest
from websockets.sync.client import connect

from tests.live_server import LiveServer, PageClient, read_stream

KEEPALIVE_S = 0.25
STEP_S = 1.5


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": STEP_S * 1000, "KEEPALIVE_S": KEEPALIVE_S}


def test_idle_sse_streams_carry_keepalive_comments(alice: PageClient) -> None:
    """While no token comes, `: keepalive` comments arrive about every KEEPALIVE_S: several in
    each 1.5 s gap, the line is never silent for much longer than that, and the reply (text, ids,
    final) is the same as without them."""
    conversation = alice.new_conversation()
    with alice.send(conversation, "[[synthetic:tokens=2]] Slowly", max_tokens=5) as response:
        record = read_stream(response)

    assert [e.event for e in record.events] == ["start", "delta", "delta", "final"]
    assert {c.text for c in record.comments} == {"keepalive"}
    start, first, second, _final = record.events
    between = [c for c in record.comments if start.at < c.at < first.at]
    assert len(between) >= 3, f"{len(between)} keepalives in a {first.at - start.at:.2f} s gap"
    assert len([c for c in record.comments if first.at < c.at < second.at]) >= 3
    moments = sorted([e.at for e in record.events] + [c.at for c in record.comments])
    silences = [b - a for a, b in pairwise(moments)]
    assert max(silences) < 1.0, f"silent for {max(silences):.2f} s despite keepalives"
    assert alice.wait_final(conversation, record.message_id)["content"] == record.text


def test_idle_websockets_get_ping_frames(server: LiveServer, alice: PageClient) -> None:
    """The WebSocket equivalent: `ping` frames between the reply's frames while it is idle."""
    conversation = alice.new_conversation()
    cookie = "; ".join(f"{k}={v}" for k, v in alice.http.cookies.items())
    frames: list[tuple[float, dict[str, object]]] = []
    with connect(server.ws_url, additional_headers={"Cookie": cookie}) as ws:
        request = {"type": "send", "conversation_id": conversation, "max_tokens": 5}
        ws.send(json.dumps({**request, "content": "[[synthetic:tokens=1]] Slowly"}))
        while not frames or frames[-1][1]["type"] not in ("final", "error"):
            frames.append((time.monotonic(), json.loads(ws.recv(timeout=10))))

    kinds = [frame["type"] for _, frame in frames]
    assert kinds[0] == "start" and kinds[-1] == "final"
    assert [k for k in kinds if k != "ping"] == ["start", "delta", "final"]
    assert kinds.count("ping") >= 3
    assert frames[-1][1]["status"] == "completed"
