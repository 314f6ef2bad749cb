"""Two web workers sharing one engine process (ENGINE=process, deploy/SCALING.md) when the engine
process dies and comes back: what the users see, and what is saved.

The workers run the Procfile's `web:` command (as replicas: PostgreSQL, sessions in Redis); the
engine process is `python -m app.engine.process` serving the synthetic engine. The replica tests
(tests/ops/test_replicas.py) run in this layout too; this file is about the engine process's own
failure, which a replica with its engine inside cannot have apart from its own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.engine_process import EngineProcess
from tests.live_server import PageClient, PageStream, SseReader, query
from tests.ops.harness import (
    STEP_MS,
    AppProcess,
    Database,
    client_like,
    release,
    throwaway_database,
)

REDIS_URL = "redis://127.0.0.1:6379"


def ready(worker: AppProcess) -> httpx.Response:
    return httpx.get(f"{worker.url}/readyz", timeout=10)


def wait_for(check, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def workers(ops_logs: Path) -> Iterator[tuple[EngineProcess, AppProcess, AppProcess, Database]]:
    redis_db = random.randint(1, 15)
    engine_env = {"ENGINE": "synthetic", "SYNTHETIC_STEP_MS": str(STEP_MS)}
    with (
        throwaway_database() as database,
        EngineProcess(ops_logs / "down.sock", engine_env, ops_logs / "down-engine.log") as engine,
    ):
        env = {
            "ENGINE": "process",
            "ENGINE_SOCKET": str(engine.socket),
            "DATABASE_URL": database.url,
            "SECRET_KEY": "shared-by-both-workers",
            "SESSION_STORE_URL": f"{REDIS_URL}/{redis_db}",
        }
        assert release(env, ops_logs / "down-release.log").returncode == 0
        a = AppProcess("worker_a", {**env, "REPLICA_ID": "wa"}, ops_logs / "down-worker-a.log")
        b = AppProcess("worker_b", {**env, "REPLICA_ID": "wb"}, ops_logs / "down-worker-b.log")
        try:
            a.start(), b.start()
            a.wait_ready(), b.wait_ready()
            yield engine, a, b, database
        finally:
            a.stop()
            b.stop()
            store = redis.Redis.from_url(f"{REDIS_URL}/{redis_db}")
            store.flushdb()
            store.close()


def test_an_engine_process_crash_fails_open_replies_saved_refuses_sends_then_serves_again(
    workers: tuple[EngineProcess, AppProcess, AppProcess, Database],
) -> None:
    engine, a, b, database = workers
    user = PageClient(a.url)
    other = None
    try:
        user.signup("engine-down@example.com")
        other = client_like(user, b.url)
        conversations = [user.new_conversation(), other.new_conversation()]
        records = [PageStream(), PageStream()]
        with (
            user.send(conversations[0], "long [[synthetic:tokens=2000]]", max_tokens=2000) as ra,
            other.send(conversations[1], "long [[synthetic:tokens=2000]]", max_tokens=2000) as rb,
        ):
            streams = [iter(SseReader(ra)), iter(SseReader(rb))]
            for events, record in zip(streams, records, strict=True):
                for item in events:
                    record.add(item)
                    if len(record.deltas) >= 3:
                        break
            engine.kill()
            for events, record in zip(streams, records, strict=True):
                for item in events:
                    record.add(item)

        for record in records:  # each worker ended its own reply, and said so
            assert record.end is not None, record.events
            final = record.end.json()
            assert final["status"] == "failed", final
            assert "engine process went away" in final.get("error", ""), final
            rows = query(
                database.async_url,
                "SELECT status, content FROM messages WHERE id = :id",
                id=record.message_id,
            )
            assert rows[0]["status"] == "failed" and rows[0]["content"] == record.text

        for worker in (a, b):  # not ready, and says why; a send is refused, not hung
            wait_for(lambda w=worker: ready(w).status_code == 503)
            assert "engine process" in ready(worker).text
        with user.send(conversations[0], "hello") as refused:
            refused.read()
        assert refused.status_code == 503, refused.text

        engine.start()  # the workers connect again by themselves
        for worker in (a, b):
            wait_for(lambda w=worker: ready(w).status_code == 200)
        for client, conversation in ((user, conversations[0]), (other, conversations[1])):
            record = PageStream()
            with client.send(conversation, "short [[synthetic:tokens=5]]") as response:
                for item in SseReader(response):
                    record.add(item)
            assert record.end is not None and record.end.json()["status"] == "completed"
    finally:
        user.close()
        if other is not None:
            other.close()
