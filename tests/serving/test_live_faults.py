"""Faults, against a real server with the synthetic engine (ENGINE=synthetic), on SQLite and
PostgreSQL: an engine failure injected mid-reply, a server killed with SIGKILL mid-reply, and a
client that stops reading.

The synthetic engine is used because these need what a real model cannot give: a failure on cue
(the `[[synthetic:fail-after=N]]` marker), and replies long and fast enough to fill a stalled
client's socket buffers within seconds (`[[synthetic:tokens=N]]` with zero-cost steps).
"""

from __future__ import annotations

import contextlib
import re
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

from tests.live_databases import migrated_database
from tests.live_server import (
    LiveServer,
    PageClient,
    PageStream,
    SseReader,
    read_stream,
    running_server,
    server_env,
)

FLUSH_INTERVAL_S = 0.2
CLIENT_DEADLINE_S = 2.0
HUGE = 10**7  # tokens: a reply that never ends on its own within a test


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SYNTHETIC_STEP_MS": 10, "FLUSH_INTERVAL_S": FLUSH_INTERVAL_S}


# -- an engine failure ---------------------------------------------------------------------------


def test_an_engine_failure_mid_reply_is_reported_in_band(alice: PageClient) -> None:
    """The engine fails after 25 tokens: the 200 stream carries the partial text, then an `error`
    event as its very last event, then ends; the row is `failed` with that partial text and the
    error, and the engine is idle."""
    conversation = alice.new_conversation()
    with alice.send(
        conversation, "[[synthetic:fail-after=25]] Hello", max_tokens=200, seed=1
    ) as response:
        record = read_stream(response)

    assert [e.event for e in record.events][:2] == ["start", "delta"]
    assert record.events[-1].event == "error"
    assert {e.event for e in record.events[1:-1]} == {"delta"}
    error = record.events[-1].json()
    assert error["status"] == "failed"
    assert "synthetic failure" in error["error"]
    assert error["usage"]["completion_tokens"] == 25
    assert int(record.events[-1].id or -1) == len(record.text) > 0

    stored = alice.wait_final(conversation, record.message_id)
    assert stored["status"] == "failed"
    assert stored["content"] == record.text
    assert "synthetic failure" in stored["error"]
    assert alice.engine_stats()["running"] == 0

    with alice.resume(record.message_id, 0) as response:  # the stored failure replays the same
        replay = read_stream(response)
    assert replay.text == record.text and replay.events[-1].event == "error"


# -- SIGKILL -----------------------------------------------------------------------------------


@pytest.fixture
def killable_server(backend: str, module_dir: Path) -> Iterator[LiveServer]:
    """A server of its own (own database) that the test may kill and restart."""
    with migrated_database(backend, module_dir) as url:
        env = server_env(
            "synthetic",
            url,
            module_dir,
            SYNTHETIC_STEP_MS=10,
            FLUSH_INTERVAL_S=FLUSH_INTERVAL_S,
        )
        with running_server(env, module_dir / "killable.log") as live:
            yield live


def length_seen_at(record: PageStream, moment: float) -> int:
    """How many characters the client had received by `moment` (time.monotonic())."""
    return sum(len(d.json()["text"]) for d in record.deltas if d.at <= moment)


def test_a_killed_server_leaves_the_flushed_text_interrupted(killable_server: LiveServer) -> None:
    """SIGKILL mid-reply (no shutdown hook runs): after a restart on the same database the row is
    `interrupted`, holding a non-empty prefix of what the client saw that lags it by no more than
    a few flush intervals; resuming it replays that text and the `interrupted` final."""
    client = PageClient(killable_server.url)
    client.signup("killed@example.com")
    conversation = client.new_conversation()
    with client.send(conversation, f"[[synthetic:tokens={HUGE}]] Go", max_tokens=2000) as response:
        assert response.status_code == 200
        reader, record = SseReader(response), PageStream()
        for item in reader:
            record.add(item)
            if record.deltas and record.deltas[-1].at - record.deltas[0].at > 1.5:
                break
        killed_at = time.monotonic()
        killable_server.kill()
        with contextlib.suppress(httpx.HTTPError):  # what was on the wire, then the reset
            read_stream(reader, record)
    assert record.end is None
    seen = record.text

    killable_server.start()
    client.login()
    stored = client.message(conversation, record.message_id)
    assert stored["status"] == "interrupted"
    assert stored["content"], "nothing was flushed"
    assert seen.startswith(stored["content"])
    assert len(stored["content"]) >= length_seen_at(record, killed_at - 5 * FLUSH_INTERVAL_S)

    with client.resume(record.message_id, 0) as response:
        replay = read_stream(response)
    assert replay.text == stored["content"]
    assert replay.end is not None and replay.end.json()["status"] == "interrupted"
    client.close()


# -- a client that stops reading -------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_server(backend: str, module_dir: Path) -> Iterator[LiveServer]:
    """Zero-cost engine steps and a huge context: a reply streams as fast as the server can frame
    it, enough to fill a stalled client's socket buffers (a few MB on loopback) in seconds."""
    with migrated_database(backend, module_dir) as url:
        env = server_env(
            "synthetic",
            url,
            module_dir,
            SYNTHETIC_STEP_MS=0,
            SYNTHETIC_PER_SEQ_MS=0,
            SYNTHETIC_PREFILL_MS_PER_TOKEN=0,
            ENGINE_CONTEXT=HUGE * 2,
            ENGINE_KV_CELLS=HUGE * 10,
            CLIENT_DEADLINE_S=CLIENT_DEADLINE_S,
            PAGE_GRACE_S=30,  # so that only the deadline can end the stalled reply
        )
        with running_server(env, module_dir / "fast.log") as live:
            yield live


@dataclass
class HealthyReader:
    """Reads a long reply in a thread as fast as it comes, noting when each chunk arrives.

    It does not parse the events (the test process must not eat the CPU the server needs): it
    keeps the arrival times, the message id from the start event, and the stream's last bytes.
    """

    client: PageClient
    conversation: str
    arrivals: list[float] = field(default_factory=list)
    head: bytes = b""
    tail: bytes = b""
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.client.send(
                self.conversation, f"[[synthetic:tokens={HUGE}]] Healthy", max_tokens=HUGE
            ) as response:
                assert response.status_code == 200
                for chunk in response.iter_raw():
                    self.arrivals.append(time.monotonic())
                    if len(self.head) < 4096:
                        self.head += chunk
                    self.tail = (self.tail + chunk)[-4096:]
        except BaseException as exc:
            self.error = exc

    @property
    def message_id(self) -> str:
        return message_id_in(self.head)

    def gaps_between(self, start: float, end: float) -> list[float]:
        times = [t for t in self.arrivals if start <= t <= end]
        return [b - a for a, b in pairwise(times)]


def message_id_in(data: bytes) -> str:
    match = re.search(rb'"message_id":"([0-9a-f-]{36})"', data)
    assert match is not None, data[:500]
    return match.group(1).decode()


def open_stalled_stream(server: LiveServer, client: PageClient, conversation: str) -> socket.socket:
    """POST a long reply over a raw socket with a tiny receive buffer; the caller reads the start
    event and then stops reading."""
    body = (f'{{"content": "[[synthetic:tokens={HUGE}]] Stalled", "max_tokens": {HUGE}}}').encode()
    cookies = "; ".join(f"{name}={value}" for name, value in client.http.cookies.items())
    request = (
        f"POST /api/conversations/{conversation}/messages HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nCookie: {cookies}\r\n"
        f"x-csrftoken: {client.csrf_headers()['x-csrftoken']}\r\n\r\n"
    ).encode() + body
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(request)
    return sock


def read_until(sock: socket.socket, pattern: bytes, limit: int = 1 << 16) -> bytes:
    data = b""
    while not re.search(pattern, data):
        chunk = sock.recv(4096)
        if not chunk or len(data) > limit:
            raise AssertionError(f"no {pattern!r} in {data[:500]!r}")
        data += chunk
    return data


def test_a_stalled_reader_is_cut_off_and_others_keep_their_pace(fast_server: LiveServer) -> None:
    """A client that stops reading a long reply: once its socket buffers are full the server
    stops taking events for it, and after CLIENT_DEADLINE_S the reply is aborted (`disconnected`,
    engine freed; the page grace is 30 s here, so only the deadline can have ended it). Meanwhile
    another stream on the same server keeps its pace (no long gaps), and the server's memory
    stays bounded (the stalled client costs a cursor, not a queue of events)."""
    admin = PageClient(fast_server.url)
    admin.signup("stall-admin@example.com")
    healthy: HealthyReader | None = None
    sock: socket.socket | None = None
    try:
        healthy = HealthyReader(admin, admin.new_conversation())
        deadline = time.monotonic() + 30
        while len(healthy.arrivals) < 50:
            assert time.monotonic() < deadline and healthy.error is None, healthy.error
            time.sleep(0.05)
        rss_before = fast_server.rss_kb()

        stalled_conversation = admin.new_conversation()
        sock = open_stalled_stream(fast_server, admin, stalled_conversation)
        stalled_id = message_id_in(read_until(sock, rb'"message_id":"[0-9a-f-]{36}"'))
        stalled_at = time.monotonic()

        # Watched through the engine's count, not the row: reading a row of megabytes ten times a
        # second would grow the server by the copies the test itself asked for.
        rss_peak = rss_before
        while admin.engine_stats()["running"] == 2:
            rss_peak = max(rss_peak, fast_server.rss_kb())
            assert time.monotonic() - stalled_at < 60, "the stalled reader was never cut off"
            time.sleep(0.1)
        cut_at = time.monotonic()
        stored = admin.wait_final(stalled_conversation, stalled_id)

        assert stored["status"] == "disconnected"
        assert cut_at - stalled_at >= CLIENT_DEADLINE_S
        assert len(stored["content"]) > 10_000  # it did stream a lot before the buffers filled
        assert healthy.error is None and healthy.thread.is_alive()

        gaps = healthy.gaps_between(stalled_at, cut_at)
        assert len(gaps) > 20, "the healthy stream stalled too"
        assert max(gaps) < 1.0, f"the healthy stream had a {max(gaps):.2f} s gap"
        assert statistics.median(gaps) < 0.05

        assert admin.cancel(healthy.message_id).json()["status"] == "cancelled"
        healthy.thread.join(timeout=30)
        assert healthy.error is None and not healthy.thread.is_alive()
        assert b"event: final" in healthy.tail and b'"status":"cancelled"' in healthy.tail
        stats = admin.wait_engine_idle(timeout_s=5)
        assert stats["running"] == 0 and stats["kv_used"] == 0

        growth_mb = (rss_peak - rss_before) / 1024
        held = len(stored["content"]) + len(
            admin.wait_final(healthy.conversation, healthy.message_id)["content"]
        )
        assert growth_mb < 200, f"the server grew by {growth_mb:.0f} MB, holding {held} characters"

        # The stalled connection, once drained, ends without a final event: it was given up on.
        sock.settimeout(10)
        rest = b""
        with contextlib.suppress(TimeoutError):
            while not rest.endswith(b"0\r\n\r\n"):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                rest += chunk
        assert rest.endswith(b"0\r\n\r\n"), rest[-300:]
        assert b"event: final" not in rest and b"event: error" not in rest
    finally:  # a failed run must not leave a reply streaming at full speed
        if sock is not None:
            sock.close()
        if healthy is not None and healthy.thread.is_alive():
            with contextlib.suppress(Exception):
                admin.cancel(healthy.message_id)
        admin.close()
