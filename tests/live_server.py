"""A real uvicorn server in a subprocess, and small clients for the page API, for live tests.

Litestar's test clients buffer streaming bodies, so anything about streaming, disconnects, slow
clients or crashes is tested against a real server on a free port:

    server = LiveServer(env={"ENGINE": "synthetic", "DATABASE_URL": url}, log_path=tmp / "server.log")
    server.start()                     # migrates, starts uvicorn, waits for GET /readyz == 200
    client = PageClient(server.url)
    client.signup("alice@example.com")
    ...
    server.kill()                      # SIGKILL: no shutdown hooks run
    server.start()                     # same port, same database
    server.stop()                      # SIGTERM, then SIGKILL if it lingers

The tests' servers run with `migrate=False` on databases from tests/live_databases.py: copies of
one this process migrated with the real `python -m app.cli db upgrade` (`upgrade` here).

Every server writes its output to `log_path`; `LiveServer.active` lists the running ones so that a
test harness can attach their logs to a failure report (see tests/serving/conftest.py).

It is the one server launcher of the project: the ops tests run the Procfile's command through it
(`command=`, tests/ops/harness.py) and the benchmarks their own settings (bench/serving_overhead.py).

`SseReader` parses `text/event-stream` by hand (comments included, with arrival times), because
keepalive comments and the timing of each event are part of what the tests check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TEST_PASSWORD = "correct horse battery staple"
TEST_POSTGRES_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

BASE_ENV = {
    "PAGE_GRACE_S": "2",
    "API_GRACE_S": "0",
    "CLIENT_DEADLINE_S": "5",
    "FLUSH_INTERVAL_S": "0.2",
    "KEEPALIVE_S": "15",
    "ENGINE_MAX_SEQS": "4",
    # One llama.cpp thread: with a thread per core, ggml's spinning workers fight the event loop
    # (and anything else on the machine) and decoding slows down by an order of magnitude.
    "ENGINE_THREADS": "1",
    "ENGINE_KV_CELLS": "8192",
    # The live tier keeps dozens of servers up at once on one PostgreSQL (max_connections 100):
    # each keeps few idle connections (more open while a burst needs them, closed after).
    "DATABASE_POOL_SIZE": "2",
    # Every test client signs up from 127.0.0.1: far more than the default 10 an hour.
    "SIGNUP_MAX_PER_ADDRESS": "10000",
    # Tests sign up many users who chat at once; the sign-up modes' own tests set theirs.
    "SIGNUP_MODE": "open",
}


# ENGINE=trtllm over the FAKE tensorrt_llm (tests/fakes/tensorrt_llm/; TensorRT-LLM needs a GPU):
# the server process imports it from PYTHONPATH. Its reply counts words up to max_tokens, one
# executor iteration (a token) every 10 ms, slow enough to Stop mid-reply, fast enough to test.
# uvicorn closes an idle keep-alive connection after 5 s (`--timeout-keep-alive`, config.py
# `timeout_keep_alive`); httpx keeps one for 5 s too, so a request sent at that boundary meets a
# closed socket ("Server disconnected without sending a response"). Clients let go first.
CLIENT_LIMITS = httpx.Limits(keepalive_expiry=2.0)

FAKE_TRTLLM_DIR = PROJECT_ROOT / "tests" / "fakes"


def engine_env(engine: str) -> dict[str, str]:
    """ENGINE and what it needs; "trtllm-fake" is ENGINE=trtllm over the fake `tensorrt_llm`."""
    if engine != "trtllm-fake":
        return {"ENGINE": engine}
    path = os.pathsep.join(p for p in (str(FAKE_TRTLLM_DIR), os.environ.get("PYTHONPATH")) if p)
    return {
        "ENGINE": "trtllm",
        "PYTHONPATH": path,
        "FAKE_TRTLLM_ENDLESS": "1",
        "FAKE_TRTLLM_STEP_MS": "10",
    }


def server_env(
    engine: str, database_url: str, data_dir: Path, **overrides: object
) -> dict[str, str]:
    """The environment of a test server: short grace/deadline/flush, then `overrides`. `engine`
    is an ENGINE value, or "trtllm-fake" (see `engine_env`)."""
    env = {
        **BASE_ENV,
        **engine_env(engine),
        "DATABASE_URL": database_url,
        "DATA_DIR": str(data_dir),
    }
    env.update({name: str(value) for name, value in overrides.items()})
    return env


def end_process(process: subprocess.Popen[bytes] | None, timeout_s: float) -> int | None:
    """SIGTERM, then SIGKILL to its whole process group (started with `start_new_session`) if it
    lingers past `timeout_s`. Returns its exit code (None for no process)."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    return process.returncode


# Under pytest-xdist each worker takes its ports from a block of its own below the kernel's
# ephemeral range (32768-60999 by default): no other worker's server, nor an outgoing connection
# of anyone's, is handed the port between the check here and the server's own bind.
WORKER_PORTS = 500


@functools.cache
def _worker_ports() -> Iterator[int]:
    """This xdist worker's block, from a random start (two runs at once rarely meet); outside
    xdist, none: the kernel picks."""
    number = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")  # "gw0", "gw1", ...
    if not number.isdigit() or int(number) >= 24:
        return iter(())
    first = 20000 + int(number) * WORKER_PORTS
    start = secrets.randbelow(WORKER_PORTS)
    return itertools.cycle([first + (start + i) % WORKER_PORTS for i in range(WORKER_PORTS)])


def free_port() -> int:
    for port in itertools.islice(_worker_ports(), WORKER_PORTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerError(RuntimeError):
    """The server did not come up (its log tail is in the message)."""


def upgrade(env: Mapping[str, str], log_path: Path, cwd: Path = PROJECT_ROOT) -> None:
    """`python -m app.cli db upgrade` on env's DATABASE_URL, its output appended to `log_path`."""
    with log_path.open("ab") as log:
        log.write(b"\n=== python -m app.cli db upgrade ===\n")
        log.flush()
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "db", "upgrade"],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-6000:]
        raise ServerError(f"migrations failed ({done.returncode}):\n{tail}")


class LiveServer:
    """One uvicorn process running `app.web.app:create_app` with the given environment.

    `command` replaces the uvicorn command line (the ops tests run the Procfile's `web:` line);
    `cwd` is the source tree it runs from (a benchmark may compare another checkout)."""

    active: ClassVar[list[LiveServer]] = []

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        port: int | None = None,
        migrate: bool = True,
        ready_timeout_s: float = 120.0,
        command: Sequence[str] | None = None,
        cwd: Path = PROJECT_ROOT,
        graceful_shutdown_s: float = 3.0,
        name: str = "server",
    ) -> None:
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "SECRET_KEY": "live-test", **env}
        self.log_path = log_path
        self.port = port or free_port()
        self.migrate = migrate
        self.ready_timeout_s = ready_timeout_s
        self.command = list(command) if command is not None else None
        self.cwd = cwd
        self.graceful_shutdown_s = graceful_shutdown_s
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self._mark = 0  # log offset where the current test began

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------

    def run_migrations(self) -> None:
        upgrade(self.env, self.log_path, self.cwd)

    def argv(self) -> list[str]:
        if self.command is not None:
            return self.command
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "app.web.app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--timeout-graceful-shutdown",
            f"{self.graceful_shutdown_s:g}",
        ]

    def start(self) -> LiveServer:
        """Migrate (first time only), start uvicorn, return once GET /readyz answers 200."""
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self) -> LiveServer:
        """Migrate (first time only) and start the process, without waiting for it to be ready
        (start several, then `wait_ready` each: they boot in parallel)."""
        if self.running:
            raise ServerError("already running")
        if self.migrate:
            self.run_migrations()
            self.migrate = False
        argv = self.argv()
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {self.name} on port {self.port}: {' '.join(argv)} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in pytest does not hit it; we end it ourselves
            )
        if self not in LiveServer.active:
            LiveServer.active.append(self)
        return self

    def wait_ready(self, timeout_s: float | None = None) -> LiveServer:
        """Until GET /readyz answers 200; ServerError (with the log's tail) if the process exits
        or `timeout_s` (default: `ready_timeout_s`) passes first."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ServerError(
                    f"the server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                response = httpx.get(f"{self.url}/readyz", timeout=2.0)
                if response.status_code == 200:
                    return self
                last = f"{response.status_code} {response.text}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise ServerError(f"not ready after {timeout_s} s ({last}):\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as in a crash or an OOM kill."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (a graceful shutdown), then SIGKILL to its process group if it is still there
        after `timeout_s`. Returns its exit code (None if it was not running)."""
        process, self.process = self.process, None
        if self in LiveServer.active:
            LiveServer.active.remove(self)
        return end_process(process, timeout_s)

    def signal(self, signum: int) -> None:
        assert self.process is not None, "the server is not running"
        self.process.send_signal(signum)

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to exit by itself (after `signal`); returns its exit code."""
        assert self.process is not None, "the server is not running"
        code = self.process.wait(timeout=timeout_s)
        self.stop()
        return code

    def restart(self) -> LiveServer:
        self.stop()
        return self.start()

    # -- observation ---------------------------------------------------------------------------

    def rss_kb(self) -> int:
        """Resident memory of the server process, from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise ServerError("no VmRSS line")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    def mark_log(self) -> None:
        """Remember where the log is now: `log_since_mark` returns what came after."""
        with contextlib.suppress(FileNotFoundError):
            self._mark = self.log_path.stat().st_size

    def log_since_mark(self, chars: int = 20000) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._mark)
                data = log.read()
        except FileNotFoundError:
            return ""
        return data.decode(errors="replace")[-chars:]


# -- server-sent events ------------------------------------------------------------------------


@dataclass
class SseEvent:
    event: str
    id: str | None
    data: str
    at: float  # time.monotonic() when its closing blank line arrived

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseComment:
    text: str
    at: float


class SseReader:
    """Parses an event stream line by line, keeping comments and arrival times.

    One reader per response: iterating it again continues where the last loop stopped.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._items = self._parse(response.iter_lines())

    def __iter__(self) -> Iterator[SseEvent | SseComment]:
        return self._items

    @staticmethod
    def _parse(lines: Iterator[str]) -> Iterator[SseEvent | SseComment]:
        event, event_id, data = "message", None, []
        for line in lines:
            now = time.monotonic()
            if line == "":
                if data:
                    yield SseEvent(event, event_id, "\n".join(data), now)
                event, data = "message", []
                continue
            if line.startswith(":"):
                yield SseComment(line[1:].strip(), now)
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "id":
                event_id = value
            elif name == "data":
                data.append(value)


@dataclass
class PageStream:
    """What a client of the page's SSE stream saw, event by event."""

    events: list[SseEvent] = field(default_factory=list)
    comments: list[SseComment] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)

    def add(self, item: SseEvent | SseComment) -> SseEvent | None:
        if isinstance(item, SseComment):
            self.comments.append(item)
            return None
        self.events.append(item)
        return item

    @property
    def deltas(self) -> list[SseEvent]:
        return [e for e in self.events if e.event == "delta"]

    @property
    def text(self) -> str:
        return "".join(e.json()["text"] for e in self.deltas)

    @property
    def start(self) -> dict[str, Any]:
        starts = [e for e in self.events if e.event == "start"]
        assert starts, f"no start event in {self.events!r}"
        return starts[0].json()

    @property
    def message_id(self) -> str:
        return self.start["message_id"]

    @property
    def end(self) -> SseEvent | None:
        """The final or error event, if the stream got that far."""
        ends = [e for e in self.events if e.event in ("final", "error")]
        return ends[-1] if ends else None

    @property
    def last_id(self) -> int:
        return int(self.events[-1].id or 0) if self.events else 0


# -- the page API --------------------------------------------------------------------------------


class PageClient:
    """A logged-in browser, as far as the page API can tell: session cookie plus CSRF header."""

    def __init__(self, base_url: str, *, timeout_s: float = 60.0) -> None:
        self.base_url = base_url
        self.http = httpx.Client(
            base_url=base_url, timeout=httpx.Timeout(timeout_s), limits=CLIENT_LIMITS
        )
        self.email: str | None = None

    def close(self) -> None:
        self.http.close()

    def csrf_headers(self) -> dict[str, str]:
        if "csrftoken" not in self.http.cookies:
            self.http.get("/healthz").raise_for_status()  # any GET sets the CSRF cookie
        return {"x-csrftoken": self.http.cookies["csrftoken"]}

    def post(self, path: str, json_body: Any = None, **kwargs: Any) -> httpx.Response:
        headers = {**self.csrf_headers(), **kwargs.pop("headers", {})}
        return self.http.post(path, json=json_body, headers=headers, **kwargs)

    def signup(self, email: str, password: str = TEST_PASSWORD) -> dict[str, Any]:
        response = self.post("/api/auth/signup", {"email": email, "password": password})
        assert response.status_code == 201, response.text
        self.email = email
        return response.json()

    def login(self, email: str | None = None, password: str = TEST_PASSWORD) -> dict[str, Any]:
        """Log in (again): after a server restart the in-memory sessions are gone."""
        self.http.cookies.clear()
        email = email or self.email
        response = self.post("/api/auth/login", {"email": email, "password": password})
        assert response.status_code in (200, 201), response.text
        self.email = email
        return response.json()

    def new_conversation(self) -> str:
        response = self.post("/api/conversations", {})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def conversation(self, conversation_id: str) -> dict[str, Any]:
        response = self.http.get(f"/api/conversations/{conversation_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def message(self, conversation_id: str, message_id: str) -> dict[str, Any]:
        for message in self.conversation(conversation_id)["messages"]:
            if message["id"] == message_id:
                return message
        raise AssertionError(f"message {message_id} is not in conversation {conversation_id}")

    def wait_final(
        self, conversation_id: str, message_id: str, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Poll until the reply has left `streaming`; returns the stored message."""
        deadline = time.monotonic() + timeout_s
        while True:
            message = self.message(conversation_id, message_id)
            if message["status"] != "streaming":
                return message
            if time.monotonic() > deadline:
                raise AssertionError(f"still streaming after {timeout_s} s: {message!r}")
            time.sleep(0.05)

    @contextlib.contextmanager
    def send(self, conversation_id: str, content: str, **params: Any) -> Iterator[httpx.Response]:
        """POST a message; yields the open streaming response (status not checked)."""
        with self.http.stream(
            "POST",
            f"/api/conversations/{conversation_id}/messages",
            json={"content": content, **params},
            headers=self.csrf_headers(),
        ) as response:
            yield response

    @contextlib.contextmanager
    def resume(self, message_id: str, last_event_id: int | None) -> Iterator[httpx.Response]:
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        with self.http.stream(
            "GET", f"/api/messages/{message_id}/stream", headers=headers
        ) as response:
            yield response

    def cancel(self, message_id: str) -> httpx.Response:
        return self.post(f"/api/messages/{message_id}/cancel")

    def engine_stats(self) -> dict[str, Any]:
        """The admin-only engine stats (this client must be the admin)."""
        response = self.http.get("/admin/api/engine")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_engine_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll the engine stats until nothing runs or waits; returns the last stats."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.engine_stats()
            if stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"the engine is still busy after {timeout_s} s: {stats!r}")
            time.sleep(0.05)


def read_stream(source: httpx.Response | SseReader, record: PageStream | None = None) -> PageStream:
    """Read an SSE response (or the rest of a reader) to its end into a PageStream."""
    reader = source if isinstance(source, SseReader) else SseReader(source)
    response = reader.response
    assert response.status_code == 200, response.read().decode(errors="replace")
    record = record or PageStream()
    for item in reader:
        record.add(item)
    return record


@contextlib.contextmanager
def running_server(
    env: Mapping[str, str], log_path: Path, *, migrate: bool = False
) -> Iterator[LiveServer]:
    """A started LiveServer, always stopped afterwards. Its database (env's DATABASE_URL) is
    already migrated (`migrated_database`) unless `migrate` says so."""
    server = LiveServer(env, log_path, migrate=migrate)
    try:
        yield server.start()
    finally:
        server.stop()


# -- looking into the database directly ---------------------------------------------------------


def query(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Run one SQL statement against the server's database (from sync test code)."""

    async def run() -> list[dict[str, Any]]:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.connect() as connection:
                result = await connection.execute(text(sql), params)
                return [dict(row._mapping) for row in result]
        finally:
            await engine.dispose()

    return asyncio.run(run())


def uuid_text(value: Any) -> str:
    """A UUID column's value as text: SQLite hands back 16 raw bytes, PostgreSQL a UUID."""
    if isinstance(value, bytes | bytearray | memoryview):
        return str(uuid.UUID(bytes=bytes(value)))
    return str(uuid.UUID(str(value)))


def row_counts(database_url: str) -> dict[str, int]:
    """How many users, conversations, messages and `streaming` messages there are."""
    sql = (
        "SELECT (SELECT count(*) FROM users) AS users,"
        " (SELECT count(*) FROM conversations) AS conversations,"
        " (SELECT count(*) FROM messages) AS messages,"
        " (SELECT count(*) FROM messages WHERE status = 'streaming') AS streaming"
    )
    return query(database_url, sql)[0]
