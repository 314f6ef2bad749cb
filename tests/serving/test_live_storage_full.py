"""A database that refuses writes for want of storage (issue 24 item 10), with real faults:

- SQLite on a real volume that fills up: a tmpfs of a few MB mounted for the test holds the
  database, and a filler file takes every byte left on it mid-reply;
- PostgreSQL refusing writes: the test database is switched to read-only
  (`ALTER DATABASE ... SET default_transaction_read_only = on`) and the app's connections are
  terminated, so that every connection it makes from then on is read-only: what a failover to a
  read-only server, or an admin freezing a database whose disk fills, looks like to the app
  (SQLSTATE 25006 on every write). A full PostgreSQL disk (SQLSTATE 53100) is not made here: the
  PostgreSQL server is shared, and filling its disk would stop everyone's. Both states are mapped
  by one function (app/db/storage.py, `storage_refusal`), checked on its own in
  tests/db/test_storage_refusals.py.

While writes are refused: a new conversation and a send answer 503 with a message that says
storage is full (or read-only), /readyz is not ready and says why, /metrics has the gauge at 1,
the admin's live view shows the alert, and a reply that was streaming when it began is kept in
memory. Once space is back (the filler deleted; the database writable again): the reply is saved
whole, /readyz is ready, and new conversations and replies work, with no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx

from app.db.storage import FULL, READ_ONLY
from tests.live_databases import migrated_database
from tests.live_server import (
    LiveServer,
    PageClient,
    running_server,
    server_env,
)
from tests.serving.db_faults import _asyncpg_dsn
from tests.serving.test_live_db_stall import ReplyReader

VOLUME = "6m"  # the tmpfs: the migrated database and its WAL take well under a megabyte
STEP_MS = 30  # the synthetic engine's step: a 300-token reply lasts ~9 s
RECOVERY_S = 30.0  # for the saver's backoff (capped at 10 s) to bring the end in


def server_for(url: str, directory: Path) -> contextlib.AbstractContextManager[LiveServer]:
    env = server_env("synthetic", url, directory, SYNTHETIC_STEP_MS=STEP_MS, FINAL_SAVE_WAIT_S=1.0)
    return running_server(env, directory / "server.log")


@contextlib.contextmanager
def small_volume(directory: Path) -> Iterator[Path]:
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={VOLUME}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mounted.returncode == 0, f"this test mounts a tmpfs (as root): {mounted.stderr}"
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(volume: Path) -> Path:
    """Take every byte left on `volume`; returns the filler file."""
    filler = volume / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: on to smaller chunks
                while True:
                    os.write(descriptor, b"\0" * chunk)
    finally:
        os.close(descriptor)
    assert os.statvfs(volume).f_bavail == 0
    return filler


def gauge(client: PageClient, kind: str) -> float:
    body = client.http.get("/metrics").text
    found = re.search(rf'^streamchat_database_refusing_writes{{kind="{kind}"}} (\S+)$', body, re.M)
    assert found, "the gauge is missing from /metrics"
    return float(found.group(1))


def wait_ready(live: LiveServer, timeout_s: float = 15.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while (ready := httpx.get(f"{live.url}/readyz")).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.2)
    return ready


def assert_refusing(
    alice: PageClient, key: str, live: LiveServer, existing: str, kind: str, words: str
) -> None:
    conversation = alice.post("/api/conversations", {})
    assert conversation.status_code == 503, conversation.text
    assert words in conversation.json()["detail"] and conversation.headers["retry-after"]
    with alice.send(existing, "Hello [[synthetic:tokens=3]]") as sent:
        sent.read()
        assert sent.status_code == 503, sent.text
        assert words in sent.json()["detail"]
    api = httpx.post(
        f"{live.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "any",
            "messages": [{"role": "user", "content": "Hi [[synthetic:tokens=3]]"}],
        },
    )
    assert api.status_code == 503, api.text  # in OpenAI's error shape
    assert words in api.json()["error"]["message"], api.text
    ready = httpx.get(f"{live.url}/readyz")
    assert ready.status_code == 503, ready.text
    assert ready.json()["database"].startswith(f"refusing writes: {kind}"), ready.text
    assert gauge(alice, kind) == 1.0
    alert = alice.http.get("/admin/live").text
    assert 'data-testid="storage-alert"' in alert, alert[:2000]


def assert_recovered(alice: PageClient, live: LiveServer, reply: ReplyReader, kind: str) -> None:
    wait_ready(live)
    assert gauge(alice, kind) == 0.0
    stored = alice.wait_final(reply.conversation, reply.record.message_id, timeout_s=RECOVERY_S)
    assert stored["status"] == "completed"
    assert stored["content"] == reply.record.text and len(stored["content"]) > 0
    again = alice.new_conversation()  # normal service, no restart
    with alice.send(again, "Back [[synthetic:tokens=5]]") as sent:
        assert sent.status_code == 200
        sent.read()
    assert 'data-testid="storage-alert"' not in alice.http.get("/admin/live").text


def signed_up(live: LiveServer) -> tuple[PageClient, str]:
    """Alice, the first account (the admin), and an API key of hers made while writes go through."""
    alice = PageClient(live.url, timeout_s=30)
    alice.signup("alice@example.com")
    made = alice.post("/api/keys", {"name": "storage test"})
    assert made.status_code == 201, made.text
    return alice, made.json()["secret"]


def test_sqlite_on_a_full_volume_refuses_clearly_and_recovers(tmp_path: Path) -> None:
    with small_volume(tmp_path / "volume") as volume:
        with migrated_database("sqlite", volume) as url, server_for(url, tmp_path) as live:
            alice, key = signed_up(live)
            try:
                assert wait_ready(live).json()["database"] == "ok"
                assert gauge(alice, FULL) == 0.0
                existing = alice.new_conversation()
                reply = ReplyReader(alice, alice.new_conversation(), tokens=300)
                reply.wait_started()
                filler = fill(volume)
                assert_refusing(alice, key, live, existing, FULL, "storage is full")
                final = reply.wait_end()  # the reply ends while the volume is full...
                assert final["status"] == "completed" and final.get("saved") is False, final
                filler.unlink()  # ...and is saved once space is back
                assert_recovered(alice, live, reply, FULL)
                assert "Internal Server Error" not in live.log_text()
            finally:
                alice.close()


async def _postgres(url: str, *sql: str) -> None:
    connection = await asyncpg.connect(_asyncpg_dsn(url).rsplit("/", 1)[0] + "/postgres")
    try:
        for statement in sql:
            await connection.execute(statement)
    finally:
        await connection.close()


def read_only(url: str, on: bool) -> None:
    """The database's new sessions read-only, and its current ones ended (the app reconnects to a
    read-only database); or its new sessions writable again, and the app's read-only ones left as
    they are, for the app to renew."""
    name = _asyncpg_dsn(url).rsplit("/", 1)[1]
    if not on:
        asyncio.run(_postgres(url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only'))
        return
    terminate = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
    asyncio.run(
        _postgres(url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on', terminate)
    )


def test_postgresql_refusing_writes_is_a_clear_503_and_recovers(tmp_path: Path) -> None:
    with migrated_database("postgresql", tmp_path) as url, server_for(url, tmp_path) as live:
        alice, key = signed_up(live)
        try:
            existing = alice.new_conversation()
            reply = ReplyReader(alice, alice.new_conversation(), tokens=300)
            reply.wait_started()
            read_only(url, True)
            try:
                assert_refusing(alice, key, live, existing, READ_ONLY, "read-only")
                final = reply.wait_end()
                assert final["status"] == "completed" and final.get("saved") is False, final
            finally:
                read_only(url, False)  # the app's sessions stay read-only: it must renew them
            assert_recovered(alice, live, reply, READ_ONLY)
            assert "Internal Server Error" not in live.log_text()
        finally:
            alice.close()
