"""What the serving path (HTTP, SSE, the event loop, the database) adds on top of the engine.

    /work/venv/bin/python bench/serving_overhead.py [--levels 64,256] [--tokens 100]
        [--llama-levels 1,8] [--llama-max-tokens 32] [--skip-llama] [--database-url URL]
        [--profile DIR [--profile-seconds S]]

The server runs in its own process (uvicorn, exactly as `scripts/serve` starts it: uvloop and
httptools when installed); this process is the load generator: one asyncio httpx client (on uvloop
when installed) that opens N page streams at once (`POST /api/conversations/{id}/messages`), one
per conversation, and records the wall-clock arrival of every SSE event. Nothing is parsed while
streaming: chunks are stamped on arrival and parsed afterwards, so the client's own cost stays low.

For each level it prints, next to each other:

- delivered: what the client saw. TTFT = request sent -> first `delta` parsed; gaps between
  consecutive `delta` events of one stream, p50/p99 per stream (the server's own percentile rule).
- engine: the same figures from the stream's `final` event (`timings`: engine-side, i.e. the times
  the Generation received the engine's deltas; TTFT from enqueue), and the ideal step time of the
  synthetic engine (`SYNTHETIC_STEP_MS + SYNTHETIC_PER_SEQ_MS * running`).
- overhead = delivered - engine, paired per stream (median and p99 over the streams).
- latency of one token, engine -> client: the client's arrival time of the first (last) delta minus
  the engine's `first_token_at` (`finished_at`) as stored in the database (same clock: same host).
  This is the true per-event serving latency, which gap differences cannot show (a constant delay
  does not change gaps).
- server CPU (utime+stime of the uvicorn process, all threads and the event-loop thread alone,
  from /proc/<pid>/stat) per delivered completion token (`usage` of the final events), and the
  server's and the client's CPU utilisation (1.00 = one core busy).

Ratios are against a baseline measured in the same run: delivered/engine for latencies, each level
against the first one for CPU per token, and for SmolLM2 each level's aggregate tokens/s against
one stream's.

With `--profile DIR`, py-spy samples the server during the largest synthetic level (that level's
figures then include py-spy's cost) and the hottest functions, by own time and inclusive, are
printed; the raw collapsed stacks are kept in DIR. `--profile-seconds S` samples only the burst's
first S seconds, where the streams' set-ups are.

Each level also prints the burst's set-up: the time from the first request to the last response
headers, the server's CPU use over it (all threads and the loop's thread; 1.00 = one core), how
long its threads waited for a CPU (runq, s per s: the machine's other load) and the loop's CPU per
stream. Use plus runq near 1 means the set-ups were CPU-bound; well under 1, they waited on
something else (the database, the pool).

The database is a fresh SQLite file in a temporary folder unless `--database-url` names another
(e.g. postgresql://user:pw@host/db: migrated, and a fresh user signs up; not cleaned afterwards).
`bench/load_abandon.py` reuses the server and client helpers of this file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.live_server import LiveServer  # noqa: E402

PASSWORD = "bench password 1234"
PROFILE_S = 0  # --profile-seconds
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOPICS = (
    "a lighthouse keeper",
    "a robot learning to paint",
    "the history of bread",
    "a city under the sea",
    "a dragon who fears fire",
    "a cat who becomes mayor",
    "a garden on the moon",
    "a train that never stops",
)


# -- the server process -------------------------------------------------------------------------


def proc_cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime in seconds of a process (all its threads) or of one of its threads."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        data = f.read()
    fields = data[data.rfind(")") + 2 :].split()  # fields[0] is field 3 (state)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def proc_runq_wait_s(pid: int) -> float:
    """Seconds the process' threads spent runnable but waiting for a CPU (/proc/.../schedstat)."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
    return total / 1e9


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def proc_socket_count(pid: int) -> int:
    """Open sockets of a process (listening one included)."""
    n = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    n += 1
    return n


class Server(LiveServer):
    """One uvicorn process serving `app.web.app:create_app` on a free port, with its own env:
    tests/live_server.py's LiveServer (the project's one launcher) with the benchmarks' settings."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        # every stream of these benchmarks belongs to one user: lift the per-user reply cap
        base = {"SECRET_KEY": "bench", "MAX_REPLIES_PER_USER": "0"}
        super().__init__(
            {**base, **env},
            log_path,
            ready_timeout_s=240.0,
            cwd=ROOT,  # read when the server is made: bench/final_save.py points it elsewhere
            graceful_shutdown_s=5.0,
            name="bench server",
        )

    def errors(self) -> Counter[str]:
        """Exceptions in the server's log (`module.SomeError: message` lines), counted."""
        found: Counter[str] = Counter()
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                m = re.match(r"^([\w.]+(?:Error|Exception)): (.*)", line)
                if m:
                    found[f"{m.group(1)}: {m.group(2)[:100]}"] += 1
        return found

    def print_errors(self) -> None:
        for what, n in self.errors().most_common(8):
            print(f"  server log: {n} x {what}")

    def cpu(self) -> tuple[float, float]:
        """(all threads, event-loop thread) CPU seconds so far."""
        return proc_cpu_s(self.pid), proc_cpu_s(self.pid, self.pid)

    def rss_mb(self) -> float:
        return proc_rss_mb(self.pid)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        return super().stop(timeout_s)


def sqlite_url(folder: Path) -> str:
    return f"sqlite+aiosqlite:///{folder / 'bench.db'}"


def run_loop(coro: Any) -> Any:
    """Run on uvloop when it is installed (the same loop uvicorn picks)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


# -- the page client ----------------------------------------------------------------------------


def new_client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base,
        # keepalive_expiry under uvicorn's 5 s keep-alive timeout: a pooled connection the server
        # is closing at that very moment would fail the next request (ReadError)
        limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0
        ),
        timeout=httpx.Timeout(None, connect=60.0),
    )


async def signup(client: httpx.AsyncClient) -> dict[str, Any]:
    """Sign up a fresh user (the first one of a database becomes its admin); keeps the cookies."""
    await client.get("/healthz")
    email = f"bench-{uuid.uuid4().hex[:12]}@example.com"
    r = await client.post(
        "/api/auth/signup", json={"email": email, "password": PASSWORD}, headers=csrf(client)
    )
    r.raise_for_status()
    return r.json()


def csrf(client: httpx.AsyncClient) -> dict[str, str]:
    return {"x-csrftoken": client.cookies.get("csrftoken") or ""}


async def new_conversations(client: httpx.AsyncClient, n: int, parallel: int = 16) -> list[str]:
    gate = asyncio.Semaphore(parallel)

    async def one(i: int) -> str:
        async with gate:
            for attempt in range(3):
                try:
                    r = await client.post(
                        "/api/conversations/", json={"title": f"bench {i}"}, headers=csrf(client)
                    )
                    break
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    if attempt == 2:
                        raise
            r.raise_for_status()
            return r.json()["id"]

    return list(await asyncio.gather(*(one(i) for i in range(n))))


@dataclass
class SseEvent:
    t: float  # wall clock when the chunk that completed it arrived
    name: str
    id: int | None
    data: dict[str, Any] | None


def parse_sse(chunks: Sequence[tuple[float, bytes]]) -> list[SseEvent]:
    """Events from time-stamped chunks; comments (keepalives) are skipped."""
    events: list[SseEvent] = []
    buf = b""
    for t, chunk in chunks:
        buf += chunk
        while b"\n\n" in buf:
            raw, buf = buf.split(b"\n\n", 1)
            name, event_id, data = "message", None, []
            for line in raw.decode("utf-8").split("\n"):
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "event":
                    name = value
                elif key == "id":
                    event_id = int(value)
                elif key == "data":
                    data.append(value)
            if data or name != "message":
                events.append(
                    SseEvent(t, name, event_id, json.loads("\n".join(data)) if data else None)
                )
    return events


@dataclass
class StreamResult:
    """One page stream as the client saw it."""

    sent_at: float
    status_code: int = 0
    headers_at: float | None = None  # response headers arrived (the handler returned)
    events: list[SseEvent] = field(default_factory=list)
    closed_early: bool = False
    closed_at: float | None = None  # when a client that left early closed its connection
    error: str | None = None

    @property
    def message_id(self) -> str | None:
        for e in self.events:
            if e.name == "start" and e.data:
                return e.data.get("message_id")
        return None

    @property
    def deltas(self) -> list[SseEvent]:
        return [e for e in self.events if e.name == "delta"]

    @property
    def final(self) -> dict[str, Any] | None:
        for e in self.events:
            if e.name in ("final", "error"):
                return e.data
        return None

    @property
    def ttft_s(self) -> float | None:
        deltas = self.deltas
        return deltas[0].t - self.sent_at if deltas else None

    @property
    def gaps_s(self) -> list[float]:
        times = [e.t for e in self.deltas]
        return [b - a for a, b in itertools.pairwise(times)]


def message_body(content: str, max_tokens: int | None) -> dict[str, Any]:
    """The JSON body of a send; no max_tokens means the server's default."""
    return (
        {"content": content}
        if max_tokens is None
        else {"content": content, "max_tokens": max_tokens}
    )


async def stream_reply(
    client: httpx.AsyncClient,
    conversation_id: str,
    content: str,
    *,
    max_tokens: int | None = None,
    close_after_s: float | None = None,
    start: asyncio.Event | None = None,
) -> StreamResult:
    """POST a message and read its SSE reply to the end (or close it after `close_after_s`)."""
    if start is not None:
        await start.wait()
    body = message_body(content, max_tokens)
    result = StreamResult(sent_at=time.time())
    chunks: list[tuple[float, bytes]] = []

    async def read() -> None:
        async with client.stream(
            "POST",
            f"/api/conversations/{conversation_id}/messages",
            json=body,
            headers=csrf(client),
        ) as response:
            result.status_code = response.status_code
            result.headers_at = time.time()
            async for chunk in response.aiter_raw():
                chunks.append((time.time(), chunk))

    try:
        await read_or_close(result, read(), close_after_s)  # closed: dropped mid-body
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.events = parse_sse(chunks)
    return result


async def read_or_close(
    result: StreamResult, reading: Awaitable[None], close_after_s: float | None
) -> bool:
    """Await `reading` to its end, or stop waiting after `close_after_s` and mark `result` closed
    early (then True: the caller hangs up, if stopping the wait did not already)."""
    if close_after_s is None:
        await reading
        return False
    try:
        await asyncio.wait_for(reading, close_after_s)
    except TimeoutError:
        result.closed_early, result.closed_at = True, time.time()
        return True
    return False


class _Collector(asyncio.Protocol):
    """Stamps every chunk the socket delivers; parsing happens after the stream ends."""

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request = request
        self.done = done
        self.chunks: list[tuple[float, bytes]] = []
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.chunks.append((time.time(), data))
        if data.endswith(b"0\r\n\r\n") and self.transport is not None:
            self.transport.close()  # the chunked body's last chunk

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def dechunk(
    chunks: Sequence[tuple[float, bytes]],
) -> tuple[int, float | None, list[tuple[float, bytes]]]:
    """(status, time the headers arrived, body pieces with their arrival times) of a raw response."""
    buf, status, headers_at, chunked = b"", 0, None, True
    out: list[tuple[float, bytes]] = []
    state, remaining = "size", 0
    for t, data in chunks:
        buf += data
        if headers_at is None:
            if b"\r\n\r\n" not in buf:
                continue
            head, buf = buf.split(b"\r\n\r\n", 1)
            status, headers_at = int(head.split(b" ", 2)[1]), t
            chunked = b"transfer-encoding: chunked" in head.lower()
        if not chunked:
            out.append((t, buf))
            buf = b""
            continue
        while state != "end":
            if state == "size":
                i = buf.find(b"\r\n")
                if i < 0:
                    break
                size, buf = int(buf[:i].split(b";")[0], 16), buf[i + 2 :]
                state, remaining = ("end", 0) if size == 0 else ("data", size)
            elif state == "data":
                if not buf:
                    break
                piece, buf = buf[:remaining], buf[remaining:]
                remaining -= len(piece)
                out.append((t, piece))
                if remaining:
                    break
                state = "crlf"
            else:  # the CRLF after a chunk's data
                if len(buf) < 2:
                    break
                buf, state = buf[2:], "size"
    return status, headers_at, out


def cookie_header(client: httpx.AsyncClient) -> str:
    return "; ".join(f"{c.name}={c.value}" for c in client.cookies.jar)


def raw_request(client: httpx.AsyncClient, conversation_id: str, body: dict[str, Any]) -> bytes:
    """The page's send-message request as bytes, with the client's session and CSRF cookies."""
    url = httpx.URL(str(client.base_url))
    payload = json.dumps(body).encode()
    return (
        f"POST /api/conversations/{conversation_id}/messages HTTP/1.1\r\n"
        f"Host: {url.host}:{url.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nCookie: {cookie_header(client)}\r\n"
        f"x-csrftoken: {client.cookies.get('csrftoken') or ''}\r\n"
        "Accept: text/event-stream\r\nConnection: close\r\n\r\n"
    ).encode() + payload


async def stream_reply_raw(
    client: httpx.AsyncClient,
    conversation_id: str,
    content: str,
    *,
    max_tokens: int | None = None,
    close_after_s: float | None = None,
    start: asyncio.Event | None = None,
) -> StreamResult:
    """The same request as `stream_reply` over a bare asyncio protocol (no HTTP library at all)."""
    if start is not None:
        await start.wait()
    url = httpx.URL(str(client.base_url))
    request = raw_request(client, conversation_id, message_body(content, max_tokens))
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    result = StreamResult(sent_at=time.time())
    try:
        transport, protocol = await loop.create_connection(
            lambda: _Collector(request, done), url.host, url.port
        )
        if await read_or_close(result, asyncio.shield(done), close_after_s):
            transport.close()  # like a closed tab: FIN, whatever the server still sends
    except OSError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.status_code, result.headers_at, pieces = dechunk(protocol.chunks)
    result.events = parse_sse(pieces)
    return result


async def stored_replies(
    database_url: str, ids: Sequence[str], *, by: str = "id"
) -> dict[str, dict[str, Any]]:
    """Assistant replies as stored, keyed by message id (`by="id"`) or by conversation id
    (`by="conversation_id"`): status, completion tokens, and queued_at / first_token_at /
    finished_at in epoch seconds."""
    from sqlalchemy import select
    from sqlalchemy.pool import NullPool

    from app.db.engine import create_engine
    from app.domain.chat.models import Message, MessageRole

    def epoch(value: Any) -> float | None:
        return None if value is None else value.timestamp()

    key = getattr(Message, by)
    keys = [uuid.UUID(k) for k in ids if k]
    engine = create_engine(database_url, poolclass=NullPool)
    out: dict[str, dict[str, Any]] = {}
    try:
        async with engine.connect() as conn:
            for i in range(0, len(keys), 500):
                rows = await conn.execute(
                    select(
                        key.label("key"),
                        Message.status,
                        Message.completion_tokens,
                        Message.queued_at,
                        Message.first_token_at,
                        Message.finished_at,
                    ).where(key.in_(keys[i : i + 500]), Message.role == MessageRole.ASSISTANT)
                )
                for row in rows:
                    out[str(row.key)] = {
                        "status": str(row.status),
                        "completion_tokens": row.completion_tokens or 0,
                        "queued_at": epoch(row.queued_at),
                        "first_token_at": epoch(row.first_token_at),
                        "finished_at": epoch(row.finished_at),
                    }
    finally:
        await engine.dispose()
    return out


# -- statistics ---------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The server's rule (app/streaming/generation.py): sorted[min(n-1, int(q*n))]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}"


def ratio(a: float, b: float) -> str:
    if not b or a != a or b != b:
        return "-"
    return f"{a / b:.2f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(
        f"{h:>{w}}" if i else f"{h:<{w}}"
        for i, (h, w) in enumerate(zip(headers, widths, strict=True))
    )
    print(line)
    print("-" * len(line))
    for row in rows:
        print(
            "  ".join(
                f"{c:>{w}}" if i else f"{c:<{w}}"
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


# -- samplers -----------------------------------------------------------------------------------


class ProcSampler(threading.Thread):
    """Samples a process' CPU (all threads, event-loop thread) and RSS every `period_s`."""

    def __init__(self, pid: int, period_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.period_s = period_s
        self.samples: list[tuple[float, float, float, float]] = []  # (wall, cpu, loop cpu, rss MB)
        self.runq: list[tuple[float, float]] = []  # (wall, s waited for a CPU: proc_runq_wait_s)
        self._stop_event = threading.Event()

    def sample(self) -> tuple[float, float, float, float]:
        with contextlib.suppress(OSError):
            s = (
                time.time(),
                proc_cpu_s(self.pid),
                proc_cpu_s(self.pid, self.pid),
                proc_rss_mb(self.pid),
            )
            self.samples.append(s)
            self.runq.append((s[0], proc_runq_wait_s(self.pid)))
            return s
        return (time.time(), float("nan"), float("nan"), float("nan"))

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def cpu_at(self, t: float) -> tuple[float, float]:
        """(cpu, loop cpu) linearly interpolated at wall time t."""
        pts = self.samples
        for a, b in itertools.pairwise(pts):
            if a[0] <= t <= b[0]:
                f = (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else 0.0
                return a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])
        return float("nan"), float("nan")

    def runq_at(self, t: float) -> float:
        for (ta, a), (tb, b) in itertools.pairwise(self.runq):
            if ta <= t <= tb:
                return a + ((t - ta) / (tb - ta) if tb > ta else 0.0) * (b - a)
        return float("nan")


async def loop_lag(out: list[float], stop: asyncio.Event, period_s: float = 0.01) -> None:
    """How late this (the client's) event loop wakes up: its own queueing delay."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        out.append(time.perf_counter() - t - period_s)


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- one level ----------------------------------------------------------------------------------


@dataclass
class LevelReport:
    label: str
    streams: int
    client: str
    wall_s: float
    results: list[StreamResult]
    server_cpu_s: float
    loop_cpu_s: float
    client_cpu_s: float
    client_lag_s: list[float]
    others_cpu_s: float  # every other process on the machine (other tests, the browser...)
    server_runq_s: float  # the server was runnable but had no CPU
    sampler: ProcSampler
    db: dict[str, dict[str, Any]]
    ideal_gap_ms: float | None
    bytes_per_token: int | None  # synthetic: every token is 4 bytes of UTF-8

    @property
    def ok(self) -> list[StreamResult]:
        return [r for r in self.results if r.final is not None and r.deltas]

    @property
    def tokens(self) -> int:
        return sum(
            int((r.final or {}).get("usage", {}).get("completion_tokens", 0)) for r in self.ok
        )

    def setup_util(self) -> tuple[float, float, float, float] | None:
        """The burst's set-up, from the first request sent to the last response headers: its
        length (s), the server's CPU use over it (all threads, the loop's thread; 1.00 = one
        core) and its threads' wait for a CPU (s per s). CPU use well under 1 with little CPU
        wait while streams still wait for their headers: they wait on something else."""
        sent = [r.sent_at for r in self.results]
        heads = [r.headers_at for r in self.results if r.headers_at]
        if not sent or not heads:
            return None
        a, b = min(sent), max(heads)
        (c0, l0), (c1, l1) = self.sampler.cpu_at(a), self.sampler.cpu_at(b)
        runq = self.sampler.runq_at(b) - self.sampler.runq_at(a)
        return b - a, (c1 - c0) / (b - a), (l1 - l0) / (b - a), runq / (b - a)

    def steady_window(self) -> tuple[float, float] | None:
        """From the last stream's first delta to the first stream's last delta: all streaming."""
        ok = self.ok
        if not ok:
            return None
        a, b = max(r.deltas[0].t for r in ok), min(r.deltas[-1].t for r in ok)
        return (a, b) if b - a >= 1.0 else None

    def steady_cpu_per_token_us(self) -> tuple[float, float]:
        """Server CPU per token while every stream is past its start and before any end."""
        window = self.steady_window()
        if window is None:
            return float("nan"), float("nan")
        a, b = window
        if self.bytes_per_token:
            tokens = sum(
                len(e.data["text"].encode()) / self.bytes_per_token
                for r in self.ok
                for e in r.deltas
                if a < e.t <= b and e.data
            )
        else:
            tokens = sum(1 for r in self.ok for e in r.deltas if a < e.t <= b)
        (c0, l0), (c1, l1) = self.sampler.cpu_at(a), self.sampler.cpu_at(b)
        if not tokens:
            return float("nan"), float("nan")
        return (c1 - c0) / tokens * 1e6, (l1 - l0) / tokens * 1e6


async def run_level(
    client: httpx.AsyncClient,
    server: Server,
    database_url: str,
    label: str,
    n: int,
    content: Any,
    max_tokens: int | None,
    *,
    kind: str = "httpx",
    ideal_gap_ms: float | None = None,
    bytes_per_token: int | None = None,
    profile_out: Path | None = None,
) -> LevelReport:
    conversations = await new_conversations(client, n)
    start = asyncio.Event()
    opener = stream_reply_raw if kind == "raw" else stream_reply
    tasks = [
        asyncio.create_task(opener(client, conv, content(i), max_tokens=max_tokens, start=start))
        for i, conv in enumerate(conversations)
    ]
    await asyncio.sleep(0.2)  # every task is parked on the gate
    profiler = None
    if profile_out is not None:
        profiler = await asyncio.create_subprocess_exec(
            shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(server.pid),
            "--rate",
            "200",
            "--gil",  # only samples that hold the GIL: where Python CPU goes
            "--format",
            "raw",
            "--nonblocking",
            *(["--duration", str(1 + PROFILE_S)] if PROFILE_S else []),
            "--output",
            str(profile_out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)
    sampler = ProcSampler(server.pid)
    lags: list[float] = []
    stop_lag = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag(lags, stop_lag))
    cpu0, loop0 = server.cpu()
    ccpu0 = client_cpu_s()
    busy0, runq0 = machine_busy_s(), proc_runq_wait_s(server.pid)
    sampler.sample()
    sampler.start()
    t0 = time.monotonic()
    start.set()
    results = await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    cpu1, loop1 = server.cpu()
    ccpu1 = client_cpu_s()
    busy1, runq1 = machine_busy_s(), proc_runq_wait_s(server.pid)
    sampler.stop()
    sampler.sample()
    stop_lag.set()
    await lag_task
    if profiler is not None:
        with contextlib.suppress(ProcessLookupError):  # ended by itself (PROFILE_S)
            profiler.send_signal(signal.SIGINT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(profiler.wait(), 30)
    db = await stored_replies(database_url, [r.message_id for r in results if r.message_id])
    return LevelReport(
        label=label,
        streams=n,
        client=kind,
        wall_s=wall,
        results=list(results),
        server_cpu_s=cpu1 - cpu0,
        loop_cpu_s=loop1 - loop0,
        client_cpu_s=ccpu1 - ccpu0,
        client_lag_s=lags,
        others_cpu_s=(busy1 - busy0) - (cpu1 - cpu0) - (ccpu1 - ccpu0),
        server_runq_s=runq1 - runq0,
        sampler=sampler,
        db=db,
        ideal_gap_ms=ideal_gap_ms,
        bytes_per_token=bytes_per_token,
    )


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def report_level(rep: LevelReport) -> list[list[str]]:
    """Rows: metric, delivered, engine, overhead (paired per stream), ratio delivered/engine."""
    ok = [r for r in rep.ok if r.ttft_s is not None]
    timings = [(r.final or {}).get("timings", {}) for r in ok]
    rows: list[list[str]] = []

    def row(name: str, c: float, e: float, d: float) -> None:
        rows.append([name, fmt(c), fmt(e), fmt(d), ratio(c, e)])

    c_ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    e_ttft = [_nan(t.get("ttft_ms")) for t in timings]
    d_ttft = [c - e for c, e in zip(c_ttft, e_ttft, strict=True)]
    row("TTFT p50 (ms)", pct(c_ttft, 0.5), pct(e_ttft, 0.5), pct(d_ttft, 0.5))
    row("TTFT p99 (ms)", pct(c_ttft, 0.99), pct(e_ttft, 0.99), pct(d_ttft, 0.99))
    with_gaps = [(r, t) for r, t in zip(ok, timings, strict=True) if r.gaps_s]
    c_p50 = [pct(r.gaps_s, 0.5) * 1000 for r, _ in with_gaps]
    c_p99 = [pct(r.gaps_s, 0.99) * 1000 for r, _ in with_gaps]
    e_p50 = [_nan(t.get("gap_p50_ms")) for _, t in with_gaps]
    e_p99 = [_nan(t.get("gap_p99_ms")) for _, t in with_gaps]
    d_p50 = [c - e for c, e in zip(c_p50, e_p50, strict=True)]
    d_p99 = [c - e for c, e in zip(c_p99, e_p99, strict=True)]
    row("gap p50, median stream (ms)", median(c_p50), median(e_p50), median(d_p50))
    row("gap p99, median stream (ms)", median(c_p99), median(e_p99), median(d_p99))
    row("gap p99, p99 stream (ms)", pct(c_p99, 0.99), pct(e_p99, 0.99), pct(d_p99, 0.99))
    if rep.ideal_gap_ms is not None:
        row(
            "gap p50 vs ideal step (ms)",
            median(c_p50),
            rep.ideal_gap_ms,
            median(c_p50) - rep.ideal_gap_ms,
        )
    headers = [(r.headers_at - r.sent_at) * 1000 for r in ok if r.headers_at]
    rows.append(
        [
            "response headers p50/p99 (ms)",
            f"{fmt(pct(headers, 0.5))}/{fmt(pct(headers, 0.99))}",
            "-",
            "-",
            "-",
        ]
    )
    setup = rep.setup_util()
    if setup is not None:
        rows.append(
            [
                "set-up: s to last headers; srv/loop util, runq; loop ms/stream",
                f"{setup[0]:.2f} s; {setup[1]:.2f}/{setup[2]:.2f}, {setup[3]:.2f}; "
                f"{setup[0] * setup[2] / rep.streams * 1000:.2f}",
                "-",
                "-",
                "-",
            ]
        )
    first, last = [], []
    for r in ok:
        stored = rep.db.get(r.message_id or "")
        if stored and stored["first_token_at"] is not None:
            first.append((r.deltas[0].t - stored["first_token_at"]) * 1000)
        if stored and stored["finished_at"] is not None:
            last.append((r.deltas[-1].t - stored["finished_at"]) * 1000)
    for name, values in (("first", first), ("last", last)):
        rows.append(
            [
                f"{name} token engine->client p50/p99 (ms)",
                f"{fmt(pct(values, 0.5))}/{fmt(pct(values, 0.99))}",
                "0",
                fmt(pct(values, 0.99)),
                "-",
            ]
        )
    lag = [x * 1000 for x in rep.client_lag_s]
    rows.append(
        [
            "client loop lag p50/p99/max (ms)",
            f"{fmt(pct(lag, 0.5))}/{fmt(pct(lag, 0.99))}/{fmt(max(lag, default=float('nan')))}",
            "-",
            "-",
            "-",
        ]
    )
    return rows


def cpu_per_token_us(rep: LevelReport) -> float:
    return rep.server_cpu_s / rep.tokens * 1e6 if rep.tokens else float("nan")


def summary_row(rep: LevelReport, base: LevelReport) -> list[str]:
    tokens = rep.tokens
    events = sum(len(r.deltas) for r in rep.ok)
    steady, steady_loop = rep.steady_cpu_per_token_us()
    statuses = Counter(
        ((r.final or {}).get("status") or r.error or f"http {r.status_code}") for r in rep.results
    )
    return [
        rep.label,
        rep.client,
        str(rep.streams),
        f"{len(rep.ok)}/{len(rep.results)}",
        str(tokens),
        f"{events / tokens:.2f}" if tokens else "-",
        fmt(rep.wall_s, 2),
        fmt(tokens / rep.wall_s, 0),
        fmt(cpu_per_token_us(rep), 0),
        fmt(rep.loop_cpu_s / tokens * 1e6 if tokens else float("nan"), 0),
        f"{fmt(steady, 0)}/{fmt(steady_loop, 0)}",
        ratio(cpu_per_token_us(rep), cpu_per_token_us(base)),
        fmt(rep.server_cpu_s / rep.wall_s, 2),
        fmt(rep.client_cpu_s / rep.wall_s, 2),
        fmt(rep.others_cpu_s / rep.wall_s, 2),
        fmt(rep.server_runq_s / rep.wall_s, 2),
        ",".join(f"{k}:{v}" for k, v in sorted(statuses.items())),
    ]


SUMMARY_HEADERS = [
    "run",
    "client",
    "streams",
    "ok",
    "tokens",
    "events/tok",
    "wall s",
    "tok/s",
    "srv us/tok",
    "loop-thr us/tok",
    "steady us/tok all/loop",
    "us/tok vs first",
    "srv util",
    "client util",
    "others util",
    "srv runq",
    "end states",
]

SUMMARY_NOTE = """
server CPU per delivered completion token. us/tok: all server threads; loop-thr: the event-loop
thread alone; steady: only while every stream was mid-reply (no request set-up, no end writes).
util: CPU seconds / wall seconds (1.00 = one core) of the server, this client, and every other
process on the machine (noise); srv runq: seconds the server waited for a CPU per wall second."""


# -- profile digest -----------------------------------------------------------------------------


def print_profile(path: Path, top: int = 20) -> None:
    """Own and inclusive sample shares of the hottest functions in py-spy's collapsed stacks."""
    if not path.exists():
        print(f"(no profile written at {path})")
        return
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        total += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        print("(empty profile)")
        return
    print(f"\npy-spy --gil: {total} samples holding the GIL, all server threads ({path})")
    print("own time (top):")
    for name, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("inclusive (top, app and library frames below the ASGI entry points):")
    shown = 0
    skip = (
        "runpy",
        "click/",
        "uvicorn/main.py",
        "uvicorn/server.py",
        "uvicorn/_compat.py",
        "uvicorn/__main__",
        "asyncio/runners.py",
    )
    for name, n in inclusive.most_common():
        if any(k in name for k in skip):
            continue
        print(f"  {100 * n / total:5.1f}%  {name}")
        shown += 1
        if shown >= top:
            break


# -- main ---------------------------------------------------------------------------------------


def synthetic_content(tokens: int) -> Any:
    return lambda i: (
        f"[[synthetic:tokens={tokens}]] stream {i}: tell me about {TOPICS[i % len(TOPICS)]}."
    )


def llama_content(i: int) -> str:
    return f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}."


async def bench_server(
    server: Server,
    database_url: str,
    label: str,
    levels: Sequence[int],
    content: Any,
    max_tokens: int | None,
    *,
    clients: Sequence[str],
    ideal: Any = None,
    bytes_per_token: int | None = None,
    profile_dir: Path | None = None,
) -> list[LevelReport]:
    reports = []
    async with new_client(server.url) as client:
        await signup(client)
        # warm-up: first-request costs (route compilation, DB connections) out of the figures
        await run_level(client, server, database_url, "warmup", 2, content, max_tokens)
        for i, n in enumerate(levels):
            for kind in clients:
                profile_out = None
                if profile_dir is not None and i == len(levels) - 1 and kind == clients[0]:
                    profile_out = profile_dir / f"{label}-{n}.txt"
                rep = await run_level(
                    client,
                    server,
                    database_url,
                    label,
                    n,
                    content,
                    max_tokens,
                    kind=kind,
                    ideal_gap_ms=ideal(n) if ideal else None,
                    bytes_per_token=bytes_per_token,
                    profile_out=profile_out,
                )
                reports.append(rep)
                print(f"\n[{label}] {n} concurrent streams, {kind} client")
                print_table(
                    ["metric", "delivered", "engine", "overhead", "ratio"], report_level(rep)
                )
                if profile_out is not None:
                    print_profile(profile_out)
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--levels", default="64,256", help="synthetic engine: concurrent streams")
    p.add_argument("--tokens", type=int, default=100, help="synthetic reply length in tokens")
    p.add_argument("--step-ms", type=float, default=None, help="SYNTHETIC_STEP_MS (app default)")
    p.add_argument(
        "--per-seq-ms", type=float, default=None, help="SYNTHETIC_PER_SEQ_MS (app default)"
    )
    p.add_argument(
        "--client",
        default="httpx",
        help="httpx, raw (bare asyncio protocol: measures the client's own share), or httpx,raw",
    )
    p.add_argument("--llama-levels", default="1,8", help="SmolLM2 (llamacpp): concurrent streams")
    p.add_argument("--llama-max-tokens", type=int, default=32)
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    p.add_argument(
        "--profile", type=Path, default=None, metavar="DIR", help="py-spy the largest level"
    )
    p.add_argument(
        "--profile-seconds",
        type=int,
        default=0,
        metavar="S",
        help="profile only the burst's first S seconds (its set-up); 0: the whole level",
    )
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra server environment, e.g. FLUSH_INTERVAL_S=5 (repeatable)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (server logs)")
    args = p.parse_args(argv)

    from app.settings import EngineSettings

    defaults = EngineSettings()
    step_ms = defaults.synthetic_step_ms if args.step_ms is None else args.step_ms
    per_seq_ms = defaults.synthetic_per_seq_ms if args.per_seq_ms is None else args.per_seq_ms
    levels = [int(x) for x in args.levels.split(",") if x]
    llama_levels = [int(x) for x in args.llama_levels.split(",") if x]
    clients = [c for c in args.client.split(",") if c]
    extra_env = dict(item.split("=", 1) for item in args.server_env)
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    global PROFILE_S
    PROFILE_S = args.profile_seconds
    print(
        f"work folder {work}; {os.cpu_count()} CPUs; server: uvicorn ({loop_name()}, httptools) "
        f"in its own process; client: this process ({loop_name()})"
    )
    all_reports: list[LevelReport] = []
    try:
        if not args.skip_synthetic:
            (work / "synthetic").mkdir()
            db_url = args.database_url or sqlite_url(work / "synthetic")
            most = max(levels)
            env = {
                "ENGINE": "synthetic",
                "DATA_DIR": str(work / "synthetic"),
                "DATABASE_URL": db_url,
                "ENGINE_MAX_SEQS": str(most),
                # a sequence reserves prompt + max_tokens cells: room for every stream at once
                "ENGINE_KV_CELLS": str(most * (args.tokens + 256) + 4096),
                "SYNTHETIC_STEP_MS": str(step_ms),
                "SYNTHETIC_PER_SEQ_MS": str(per_seq_ms),
                **extra_env,
            }
            print(
                f"\n== synthetic engine: {args.tokens}-token replies, step {step_ms} ms "
                f"+ {per_seq_ms} ms/seq, max_seqs {most}, database {db_url.split(':')[0]}"
            )
            server = Server(env, work / "server-synthetic.log").start()
            try:
                reps = run_loop(
                    bench_server(
                        server,
                        db_url,
                        "synthetic",
                        levels,
                        synthetic_content(args.tokens),
                        args.tokens,
                        clients=clients,
                        ideal=lambda n: step_ms + per_seq_ms * n,
                        bytes_per_token=4,
                        profile_dir=args.profile,
                    )
                )
            finally:
                server.stop()
                server.print_errors()
            all_reports += reps
            print(SUMMARY_NOTE)
            print_table(SUMMARY_HEADERS, [summary_row(r, reps[0]) for r in reps])
        if not args.skip_llama:
            (work / "llama").mkdir()
            db_url = args.database_url or sqlite_url(work / "llama")
            env = {
                "ENGINE": "llamacpp",
                "DATA_DIR": str(work / "llama"),
                "DATABASE_URL": db_url,
                **extra_env,
            }
            print(
                f"\n== SmolLM2 (llamacpp): max_tokens {args.llama_max_tokens}, levels {llama_levels}, "
                f"database {db_url.split(':')[0]}"
            )
            server = Server(env, work / "server-llama.log").start()
            try:
                reps = run_loop(
                    bench_server(
                        server,
                        db_url,
                        "smollm2",
                        llama_levels,
                        llama_content,
                        args.llama_max_tokens,
                        clients=clients[:1],
                    )
                )
            finally:
                server.stop()
                server.print_errors()
            all_reports += reps
            print(SUMMARY_NOTE)
            print_table(SUMMARY_HEADERS, [summary_row(r, reps[0]) for r in reps])
            base_rate = reps[0].tokens / reps[0].wall_s
            print(
                "\nSmolLM2 aggregate tokens/s (completion tokens / wall, first request to last final):"
            )
            print_table(
                ["streams", "tokens", "wall s", "tok/s", "vs first level"],
                [
                    [
                        str(r.streams),
                        str(r.tokens),
                        fmt(r.wall_s, 2),
                        fmt(r.tokens / r.wall_s, 1),
                        ratio(r.tokens / r.wall_s, base_rate),
                    ]
                    for r in reps
                ],
            )
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if any(len(r.ok) != len(r.results) for r in all_reports) else 0


if __name__ == "__main__":
    sys.exit(main())
