"""The Procfile as a platform runs it: `release:` migrates, `web:` shuts down gracefully on SIGTERM.

On SIGTERM (a deploy, a scale-down) uvicorn stops accepting connections at once, lets open
streams run for up to --timeout-graceful-shutdown seconds, then the app's shutdown ends whatever
is still generating with a saved state (`interrupted`). Either way no row is left `streaming`,
and the process exits well inside a platform's kill timeout.

"Exits cleanly" means: the app's shutdown completed, and the exit status is 0 or "terminated by
SIGTERM". uvicorn (0.29 and later) re-raises the signal it caught once its orderly shutdown is
done, so that its parent sees the conventional status for a SIGTERM'd process (143 in a shell);
systemd counts that as success, and platforms that send SIGTERM expect it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import PageClient, PageStream, SseReader, query
from tests.ops.harness import (
    STEP_MS,
    AppProcess,
    Database,
    procfile,
    release,
    throwaway_database,
)


@pytest.fixture(scope="module")
def database() -> Iterator[Database]:
    with throwaway_database() as database:
        yield database


def app_env(database: Database, graceful_s: int) -> dict[str, str]:
    return {
        "ENGINE": "synthetic",
        "SYNTHETIC_STEP_MS": str(STEP_MS),
        "DATABASE_URL": database.url,
        "GRACEFUL_SHUTDOWN_S": str(graceful_s),
    }


def test_release_applies_the_migrations_and_can_run_again(
    database: Database, ops_logs: Path
) -> None:
    assert set(procfile()) == {"web", "release"}
    log = ops_logs / "procfile-release.log"
    for _ in range(2):  # every deploy runs it: it must be idempotent
        assert release({"DATABASE_URL": database.url}, log).returncode == 0, log.read_text()
    versions = query(database.async_url, "SELECT version_num FROM alembic_version")
    assert len(versions) == 1 and versions[0]["version_num"]
    assert query(database.async_url, "SELECT count(*) AS n FROM messages") == [{"n": 0}]


def refuses_connections(port: int, within_s: float = 2.0) -> bool:
    """True once a new TCP connection to `port` is refused (the listener is closed)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
        except OSError:
            return True
        time.sleep(0.05)
    return False


def sigterm_mid_reply(
    app: AppProcess, content: str, **params: object
) -> tuple[PageStream, str, bool, float, int]:
    """Start a reply, SIGTERM the server after 5 deltas, read what is left of the stream.

    Returns (the stream, its message id, whether new connections were refused while the server
    was still running, seconds from SIGTERM to exit, the exit code).
    """
    client = PageClient(app.url)
    client.signup(f"term-{time.monotonic_ns()}@example.com")
    conversation = client.new_conversation()
    record = PageStream()
    refused = False
    signalled_at = 0.0
    try:
        with client.send(conversation, content, **params) as response:
            assert response.status_code == 200
            events = iter(SseReader(response))
            for item in events:
                record.add(item)
                if len(record.deltas) == 5:
                    break
            app.signal(signal.SIGTERM)
            signalled_at = time.monotonic()
            refused = refuses_connections(app.port) and app.running  # ...while still up
            with contextlib.suppress(httpx.HTTPError):  # the stream may be cut short
                for item in events:
                    record.add(item)
    finally:
        client.close()
    code = app.wait_exit(timeout_s=30)
    return record, record.message_id, refused, time.monotonic() - signalled_at, code


def assert_clean_exit(app: AppProcess, code: int) -> None:
    assert code in (0, -signal.SIGTERM), f"exit status {code}"
    assert "Application shutdown complete." in app.log_text(), app.log_text()[-3000:]


def test_the_web_process_is_uvicorn_itself(database: Database, ops_logs: Path) -> None:
    """`exec` in the Procfile: SIGTERM reaches uvicorn, not a shell that would not forward it."""
    app = AppProcess("procfile_exec", app_env(database, 2), ops_logs / "procfile-exec.log")
    try:
        app.start().wait_ready()
        cmdline = Path(f"/proc/{app.pid}/cmdline").read_bytes().split(b"\0")
        assert any(part.endswith(b"uvicorn") for part in cmdline), cmdline
        assert b"--timeout-graceful-shutdown" in cmdline and b"2" in cmdline
    finally:
        app.stop()


def test_sigterm_saves_a_reply_that_outlasts_the_graceful_wait(
    database: Database, ops_logs: Path
) -> None:
    graceful_s = 2
    app = AppProcess("procfile_long", app_env(database, graceful_s), ops_logs / "procfile-long.log")
    app.start().wait_ready()
    try:
        record, message_id, refused, took, code = sigterm_mid_reply(
            app, "a long one [[synthetic:tokens=1500]]", max_tokens=1500
        )
    finally:
        app.stop()
    print(f"\nlong reply: SIGTERM to exit {took:.2f} s, exit code {code}")
    assert refused, "the server kept accepting connections after SIGTERM"
    assert_clean_exit(app, code)
    assert graceful_s - 0.5 < took < graceful_s + 8
    row = query(
        database.async_url, "SELECT status, content FROM messages WHERE id = :id", id=message_id
    )[0]
    assert row["status"] == "interrupted"
    assert row["content"].startswith(record.text) and len(row["content"]) >= len(record.text)
    assert query(
        database.async_url, "SELECT count(*) AS n FROM messages WHERE status = 'streaming'"
    ) == [{"n": 0}]


def test_sigterm_lets_a_short_reply_finish(database: Database, ops_logs: Path) -> None:
    graceful_s = 10
    app = AppProcess(
        "procfile_short", app_env(database, graceful_s), ops_logs / "procfile-short.log"
    )
    app.start().wait_ready()
    try:
        # 60 tokens: 1.8 s, well inside the 10 s graceful wait.
        record, message_id, refused, took, code = sigterm_mid_reply(
            app, "a short one [[synthetic:tokens=60]]"
        )
    finally:
        app.stop()
    print(f"\nshort reply: SIGTERM to exit {took:.2f} s, exit code {code}")
    assert refused, "the server kept accepting connections after SIGTERM"
    assert_clean_exit(app, code)
    assert took < graceful_s  # it left when the reply was done, before the graceful wait ran out
    assert record.end is not None and record.end.json()["status"] == "completed"
    row = query(
        database.async_url, "SELECT status, content FROM messages WHERE id = :id", id=message_id
    )[0]
    assert row["status"] == "completed" and row["content"] == record.text
