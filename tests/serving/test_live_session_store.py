"""A shared session store that goes away and comes back (SESSION_STORE_URL, issue 24 item 9).

A real Redis of the test's own (`redis-server` on a free port, never the shared one on 6379) is
stopped and started again under a live server:

- while it is down, `/healthz` stays 200, `/readyz` answers 503 naming the session store, pages and
  the API answer 503 with a message that says so (never a 500), and a log-in is refused (the
  log-in limits fail closed: no attempt goes uncounted);
- once it is back (empty: `--save ""`, as a Redis restarted without persistence), the server
  serves again by itself, with no 500 on the way: the first log-in after the restart goes through
  although every pooled connection of the app was closed by the old Redis.

The control: the same restart under a redis-py client built as the app built it before
(`Redis.from_url(url)`, redis-py's defaults), whose first command after the restart fails with
the stale pooled connection's "Connection closed by server", as the log-in limiter did.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.web.session_store import redis_client
from tests.live_databases import migrated_database
from tests.live_server import (
    TEST_PASSWORD,
    LiveServer,
    PageClient,
    end_process,
    free_port,
    running_server,
    server_env,
)

MESSAGE = "the session store is unreachable"


class PrivateRedis:
    """`redis-server` on a port of its own, without persistence; stop() and start() at will."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (scripts/test installs it)"
        self.argv = [binary, "--bind", "127.0.0.1", "--port", str(free_port())]
        self.argv += ["--save", "", "--appendonly", "no", "--dir", str(directory)]
        self.port = int(self.argv[4])
        self.log = directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return self
            time.sleep(0.05)
        raise AssertionError(f"redis-server did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        end_process(self.process, 5.0)
        self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    redis = PrivateRedis(tmp_path).start()
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture
def shared_store_server(redis_server: PrivateRedis, tmp_path: Path) -> Iterator[LiveServer]:
    with migrated_database("sqlite", tmp_path) as url:
        env = server_env("synthetic", url, tmp_path, SESSION_STORE_URL=redis_server.url)
        with running_server(env, tmp_path / "server.log") as live:
            yield live


def logged_in(live: LiveServer, email: str) -> PageClient:
    client = PageClient(live.url, timeout_s=10)
    client.signup(email)
    return client


def test_the_app_answers_503s_while_redis_is_down_and_recovers_with_no_500(
    shared_store_server: LiveServer, redis_server: PrivateRedis
) -> None:
    live = shared_store_server
    alice = logged_in(live, "alice@example.com")
    stranger = PageClient(live.url, timeout_s=10)
    try:
        assert alice.http.get("/api/conversations").status_code == 200
        ready = httpx.get(f"{live.url}/readyz")
        assert ready.status_code == 200 and ready.json()["session_store"] == "ok", ready.text
        alice.csrf_headers()
        stranger.csrf_headers()  # the CSRF cookie, taken while all is well

        redis_server.stop()
        live.mark_log()
        started = time.monotonic()
        answers = {
            "healthz": alice.http.get("/healthz"),  # with the session cookie, as a browser sends
            "readyz": alice.http.get("/readyz"),
            "page": alice.http.get("/"),
            "api": alice.http.get("/api/conversations"),
            "write": alice.post("/api/conversations", {}),
            "login": stranger.post(
                "/api/auth/login", {"email": "alice@example.com", "password": TEST_PASSWORD}
            ),
        }
        took = time.monotonic() - started
        codes = {name: response.status_code for name, response in answers.items()}
        assert codes == {
            "healthz": 200,
            "readyz": 503,
            "page": 503,
            "api": 503,
            "write": 503,
            "login": 503,
        }, {name: r.text[:200] for name, r in answers.items()}
        assert answers["readyz"].json()["session_store"].startswith("unreachable"), answers[
            "readyz"
        ].text
        for name in ("page", "api", "write", "login"):
            assert MESSAGE in answers[name].text, (name, answers[name].text)
            assert answers[name].headers.get("retry-after"), name
        assert took < 10, f"six requests took {took:.1f} s with Redis down: it must fail fast"
        assert "Traceback" not in live.log_since_mark()

        redis_server.start()  # empty: the sessions are gone, as after a restart without disk
        live.mark_log()
        assert httpx.get(f"{live.url}/readyz").status_code == 200
        # The stale pooled connections of the limiter and the session store: no 500 on the way.
        again = stranger.post(
            "/api/auth/login", {"email": "alice@example.com", "password": TEST_PASSWORD}
        )
        assert again.status_code in (200, 201), again.text
        assert stranger.http.get("/api/conversations").status_code == 200
        assert stranger.post("/api/conversations", {}).status_code == 201
        assert alice.http.get("/api/conversations").status_code == 401  # her session went with it
        assert " 500 " not in live.log_since_mark() and "Traceback" not in live.log_since_mark()
    finally:
        alice.close()
        stranger.close()


async def _command_after_restart(client: Redis, redis: PrivateRedis) -> BaseException | None:
    await client.set("k", "v")  # a pooled connection, open
    redis.stop()
    redis.start()
    try:
        await client.get("k")
    except Exception as exc:
        return exc
    finally:
        await client.aclose()
    return None


def test_control_a_client_without_retries_fails_on_its_stale_connection(
    redis_server: PrivateRedis,
) -> None:
    before = Redis.from_url(redis_server.url)
    error = asyncio.run(_command_after_restart(before, redis_server))
    assert isinstance(error, RedisConnectionError), repr(error)
    assert "closed by server" in str(error)
    assert asyncio.run(_command_after_restart(redis_client(redis_server.url), redis_server)) is None


def test_a_burst_of_requests_waits_for_the_stores_connections_instead_of_failing(
    shared_store_server: LiveServer,
) -> None:
    """300 requests at once, each loading its session from Redis: more than the client's pool of
    100 connections. redis-py's default pool refused the 101st at once (`MaxConnectionsError`,
    a 503 here); the app's pool makes them wait for a connection, so every one answers 200."""
    client = logged_in(shared_store_server, "burst@example.com")
    cookies = dict(client.http.cookies)
    client.close()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(
            base_url=shared_store_server.url,
            cookies=cookies,
            timeout=30,
            limits=httpx.Limits(max_connections=None),
        ) as http:
            responses = await asyncio.gather(*(http.get("/api/conversations") for _ in range(300)))
        return [r.status_code for r in responses]

    statuses = asyncio.run(burst())
    assert statuses.count(200) == 300, sorted(set(statuses))
