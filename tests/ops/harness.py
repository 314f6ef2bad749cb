"""Real processes for the ops tests: app replicas started from the Procfile, nginx from deploy/.

- `AppProcess` runs the Procfile's `web:` command (so the tests exercise the command a platform
  runs) with its own environment and log file, through tests/live_server.py's `LiveServer`;
  `release()` runs the `release:` command.
- `Nginx` runs a rendered deploy/nginx.conf from a private prefix directory, as an unprivileged
  nginx would (`nginx -p <dir> -c nginx.conf -g 'daemon off; pid <dir>/nginx.pid;'`).
- `throwaway_database()` makes a PostgreSQL database with a random name and drops it afterwards.
- `Arrivals` and `delivery_problems()` judge whether a reply reached the client token by token
  or all at once: the check the buffering control run must fail.

Clients and the SSE parser come from tests/live_server.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy.engine import make_url

from tests.live_databases import throwaway_database as postgres_database
from tests.live_server import (
    LiveServer,
    PageClient,
    PageStream,
    SseReader,
    end_process,
    free_port,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROCFILE = PROJECT_ROOT / "Procfile"
NGINX_TEMPLATE = PROJECT_ROOT / "deploy" / "nginx.conf"
NGINX_PLACEHOLDERS = ("LISTEN", "REPLICA_A", "REPLICA_B", "PROXY_READ_TIMEOUT")
VENV_BIN = str(Path(sys.executable).parent)
STEP_MS = 30  # the synthetic engine's step in most ops tests: one token per 30 ms


def procfile() -> dict[str, str]:
    """The Procfile's process types: {"web": command, "release": command}."""
    commands = {}
    for line in PROCFILE.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_-]+):\s*(.+)", line.strip())
        if match:
            commands[match.group(1)] = match.group(2)
    return commands


def process_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test's environment with the venv first on PATH (the Procfile says `uvicorn`, `python`)."""
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "SIGNUP_MODE": "open",  # the tests sign up many users who chat at once
        **extra,
    }


# -- PostgreSQL ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    url: str  # what the app gets as DATABASE_URL
    async_url: str  # for tests.live_server.query()


@contextlib.contextmanager
def throwaway_database() -> Iterator[Database]:
    """A PostgreSQL database with a random name, dropped afterwards (tests/live_databases.py's)."""
    with postgres_database("postgresql", Path(tempfile.gettempdir())) as async_url:
        yield Database(
            url=make_url(async_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False),
            async_url=async_url,
        )


def release(env: Mapping[str, str], log_path: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the Procfile's `release:` command (migrations) with `env`."""
    with log_path.open("ab") as log:
        log.write(b"\n=== release ===\n")
        log.flush()
        return subprocess.run(
            ["bash", "-c", procfile()["release"]],
            cwd=PROJECT_ROOT,
            env=process_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )


# -- processes ----------------------------------------------------------------------------------


class Managed:
    """Something this test run started and must end; `running` lists them for failure reports."""

    running: ClassVar[list[Managed]] = []

    name: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _end(self, timeout_s: float) -> int | None:
        """SIGTERM, then SIGKILL to its whole process group if it lingers. Returns the exit code."""
        process, self.process = self.process, None
        if self in Managed.running:
            Managed.running.remove(self)
        return end_process(process, timeout_s)

    def _spawn(self, argv: list[str], env: Mapping[str, str], cwd: Path) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {self.name}: {' '.join(argv)} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        Managed.running.append(self)


class AppProcess(LiveServer):
    """One replica: the Procfile's `web:` command on a free port, launched by tests/live_server.py's
    LiveServer (the one launcher), listed in `Managed.running` for failure reports."""

    def __init__(self, name: str, env: Mapping[str, str], log_path: Path) -> None:
        port = free_port()
        super().__init__(
            process_env({"SECRET_KEY": "ops-test-secret", **env, "PORT": str(port)}),
            log_path,
            port=port,
            migrate=False,  # the Procfile's `release:` command migrates: see `release()`
            ready_timeout_s=90.0,
            command=["bash", "-c", procfile()["web"]],
            name=name,
        )

    def start(self) -> AppProcess:  # type: ignore[override]
        """Start without waiting (start several, then `wait_ready` each: they boot in parallel)."""
        assert self.process is None, f"{self.name} is already running"
        self.spawn()
        Managed.running.append(self)  # type: ignore[arg-type]
        return self

    def kill(self) -> None:
        """SIGKILL: a crash (no shutdown hooks run)."""
        super().kill()
        self.stop(0)

    def stop(self, timeout_s: float = 40.0) -> int | None:
        if self in Managed.running:
            Managed.running.remove(self)  # type: ignore[arg-type]
        return super().stop(timeout_s)


def render_nginx(template: str | None = None, **values: str) -> str:
    """deploy/nginx.conf with its placeholders filled in, as `envsubst '$LISTEN ...'` would."""
    text = NGINX_TEMPLATE.read_text() if template is None else template
    assert sorted(values) == sorted(NGINX_PLACEHOLDERS), f"give exactly {NGINX_PLACEHOLDERS}"
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    assert "${" not in text, "a placeholder was left unrendered"
    return text


def buffering_variant(conf: str, *, honour_app_header: bool = False) -> str:
    """The control: the same config with the classic mistakes: buffering on, the app's
    `X-Accel-Buffering: no` ignored, gzip on event streams. With `honour_app_header`, only
    buffering is switched on, and the app's header is left to switch it off again."""
    good = "        proxy_buffering off;\n"
    assert conf.count(good) == 1, "deploy/nginx.conf no longer has one server-wide buffering line"
    bad = "        proxy_buffering on;\n"
    if not honour_app_header:
        bad += (
            "        proxy_ignore_headers X-Accel-Buffering;\n"
            "        gzip on;\n"
            "        gzip_types text/event-stream;\n"
            "        gzip_min_length 0;\n"
        )
    return conf.replace(good, bad)


def nginx_binary() -> str:
    found = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert found, "nginx is not installed: apt-get install nginx (scripts/test does it as root)"
    return found


class Nginx(Managed):
    """nginx with a given config, running from its own prefix directory (logs, temp files)."""

    def __init__(self, name: str, conf: str, port: int) -> None:
        self.name = name
        self.port = port
        # Workers run as `nobody` when the tests run as root: they must be able to enter here.
        self.prefix = Path(tempfile.mkdtemp(prefix=f"streamchat-{name}-"))
        self.prefix.chmod(0o755)
        (self.prefix / "logs").mkdir()
        (self.prefix / "nginx.conf").write_text(conf)
        self.log_path = self.prefix / "logs" / "error.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self, timeout_s: float = 10.0) -> Nginx:
        self._spawn(
            [
                nginx_binary(),
                "-p",
                f"{self.prefix}/",
                "-c",
                "nginx.conf",
                "-g",
                f"daemon off; pid {self.prefix}/nginx.pid;",
            ],
            os.environ,
            self.prefix,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"nginx {self.name} exited:\n{self.log_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            time.sleep(0.05)
        raise AssertionError(f"nginx {self.name} is not listening on {self.port}")

    def access_log(self) -> str:
        return (self.prefix / "logs" / "access.log").read_text(errors="replace")

    def stop(self) -> None:
        self._end(10.0)
        shutil.rmtree(self.prefix, ignore_errors=True)


def proxy_for(name: str, replicas: tuple[AppProcess, AppProcess], read_timeout: str) -> str:
    """deploy/nginx.conf rendered for these replicas on a free port (the port is in LISTEN)."""
    a, b = replicas
    return render_nginx(
        LISTEN=f"127.0.0.1:{free_port()}",
        REPLICA_A=f"127.0.0.1:{a.port}",
        REPLICA_B=f"127.0.0.1:{b.port}",
        PROXY_READ_TIMEOUT=read_timeout,
    )


def start_nginx(name: str, conf: str) -> Nginx:
    port = int(re.search(r"listen 127\.0\.0\.1:(\d+);", conf).group(1))  # type: ignore[union-attr]
    return Nginx(name, conf, port).start()


# -- clients ------------------------------------------------------------------------------------


def client_like(other: PageClient, base_url: str) -> PageClient:
    """A client on another address carrying `other`'s cookies (the same browser, logged in)."""
    client = PageClient(base_url)
    for cookie in other.http.cookies.jar:
        client.http.cookies.jar.set_cookie(cookie)
    return client


def cookie_header(client: PageClient) -> str:
    return "; ".join(f"{c.name}={c.value}" for c in client.http.cookies.jar)


@dataclass
class Arrivals:
    """When a reply's parts reached the client (time.monotonic() seconds)."""

    sent_at: float
    deltas: list[float] = field(default_factory=list)
    final_at: float | None = None
    text: str = ""
    final: dict[str, Any] | None = None

    @property
    def ttft_ms(self) -> float:
        assert self.deltas, "no delta arrived"
        return (self.deltas[0] - self.sent_at) * 1000.0

    @property
    def bursts(self) -> int:
        """Groups of deltas that arrived together (less than 10 ms apart)."""
        return 1 + sum(1 for a, b in itertools.pairwise(self.deltas) if b - a > 0.010)

    def summary(self) -> str:
        if not self.deltas or self.final_at is None:
            return f"incomplete: {len(self.deltas)} deltas, final at {self.final_at}"
        total = self.final_at - self.sent_at
        return (
            f"TTFT {self.ttft_ms:.0f} ms, {len(self.deltas)} deltas in {self.bursts} bursts, "
            f"first/last delta at {self.deltas[0] - self.sent_at:.2f}/"
            f"{self.deltas[-1] - self.sent_at:.2f} s, final at {total:.2f} s"
        )


def delivery_problems(arrivals: Arrivals, *, min_bursts: int = 5) -> list[str]:
    """Why this reply did not arrive token by token (empty: it did).

    Incremental means the first delta arrives early in the reply (before half of it has elapsed),
    the deltas are spread over at least half of the reply's duration, and they come in several
    separate bursts rather than in one lump at the end.
    """
    if not arrivals.deltas or arrivals.final_at is None:
        return [f"the reply did not complete: {arrivals.summary()}"]
    total = arrivals.final_at - arrivals.sent_at
    first = arrivals.deltas[0] - arrivals.sent_at
    spread = arrivals.deltas[-1] - arrivals.deltas[0]
    problems = []
    if first > 0.5 * total:
        problems.append(f"the first delta came {first:.2f} s into a {total:.2f} s reply")
    if spread < 0.5 * total:
        problems.append(f"the deltas spread over {spread:.2f} s of a {total:.2f} s reply")
    if arrivals.bursts < min_bursts:
        problems.append(f"{len(arrivals.deltas)} deltas arrived in {arrivals.bursts} bursts")
    return problems


def sse_reply(client: PageClient, conversation_id: str, content: str, **params: Any) -> Arrivals:
    """Send a message over the page's SSE API and time every delta and the final event."""
    arrivals = Arrivals(sent_at=time.monotonic())
    with client.send(conversation_id, content, **params) as response:
        assert response.status_code == 200, response.read().decode(errors="replace")
        record = PageStream(started_at=arrivals.sent_at)
        for item in SseReader(response):
            event = record.add(item)
            if event is None:
                continue
            if event.event == "delta":
                arrivals.deltas.append(event.at)
                arrivals.text += event.json()["text"]
            elif event.event in ("final", "error"):
                arrivals.final_at = event.at
                arrivals.final = {"event": event.event, **event.json()}
    return arrivals


def ws_reply(
    client: PageClient, ws_url: str, origin: str, conversation_id: str, content: str
) -> Arrivals:
    """The same over the page's WebSocket, through whatever `ws_url` points at."""
    from websockets.sync.client import connect

    with connect(
        ws_url,
        origin=origin,  # type: ignore[arg-type]
        additional_headers={"Cookie": cookie_header(client)},
        proxy=None,
        compression=None,
        open_timeout=10,
    ) as socket_:
        arrivals = Arrivals(sent_at=time.monotonic())
        socket_.send(
            json.dumps({"type": "send", "conversation_id": conversation_id, "content": content})
        )
        while True:
            message = json.loads(socket_.recv(timeout=30))
            now = time.monotonic()
            kind = message.get("type")
            if kind == "delta":
                arrivals.deltas.append(now)
                arrivals.text += message["text"]
            elif kind in ("final", "error", "rejected"):
                arrivals.final_at = now
                arrivals.final = message
                return arrivals


def in_thread(target: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run target(*args) in a thread; the dict gets "result" or "error"."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target(*args)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
