"""Two replicas behind deploy/nginx.conf: one database, sessions in Redis, Stop over NOTIFY.

Replicas a and b run the Procfile's `web:` command with the same SECRET_KEY, the same PostgreSQL
database and the same Redis session store; nginx routes each log-in session to one of them. The
tests go around nginx on purpose (straight to a replica's port) to prove what works without it:
a Stop that lands on the wrong replica, a resume served from the database by the other replica,
and a restart that only interrupts the restarted replica's own replies.

Every test runs twice: each replica with its own engine (a GPU each), and both replicas as web
workers of one engine process (ENGINE=process, `python -m app.engine.process`: one GPU, the
web side's CPU spread over processes; deploy/SCALING.md).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.engine_process import EngineProcess
from tests.live_server import PageClient, PageStream, SseComment, SseReader, query
from tests.ops.harness import (
    STEP_MS,
    AppProcess,
    Database,
    Nginx,
    client_like,
    in_thread,
    proxy_for,
    release,
    start_nginx,
    throwaway_database,
)

REDIS_URL = "redis://127.0.0.1:6379"


@dataclass
class Cluster:
    a: AppProcess
    b: AppProcess
    nginx: Nginx
    database: Database
    user: PageClient  # logged in through nginx

    def replica(self, replica_id: str) -> AppProcess:
        return {"a": self.a, "b": self.b}[replica_id]

    def other(self, replica_id: str) -> AppProcess:
        return {"a": self.b, "b": self.a}[replica_id]

    def row(self, message_id: str) -> dict[str, Any]:
        rows = query(
            self.database.async_url,
            "SELECT status, replica_id, content, completion_tokens FROM messages WHERE id = :id",
            id=message_id,
        )
        assert rows, f"no message {message_id}"
        return rows[0]


@pytest.fixture(scope="module", params=["own engines", "one engine process"])
def cluster(ops_logs: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    redis_db = random.randint(1, 15)
    engine = {"ENGINE": "synthetic", "SYNTHETIC_STEP_MS": str(STEP_MS)}
    with contextlib.ExitStack() as stack:
        if request.param == "one engine process":
            shared = stack.enter_context(
                EngineProcess(ops_logs / "engine.sock", engine, ops_logs / "engine-process.log")
            )
            engine = {"ENGINE": "process", "ENGINE_SOCKET": str(shared.socket)}
        yield from _cluster(ops_logs, redis_db, engine)


def _cluster(ops_logs: Path, redis_db: int, engine: dict[str, str]) -> Iterator[Cluster]:
    with throwaway_database() as database:
        env = {
            **engine,
            "DATABASE_URL": database.url,
            "SECRET_KEY": "shared-by-both-replicas",
            "SESSION_STORE_URL": f"{REDIS_URL}/{redis_db}",
            "GRACEFUL_SHUTDOWN_S": "3",
        }
        assert release(env, ops_logs / "replicas-release.log").returncode == 0
        a = AppProcess("replica_a", {**env, "REPLICA_ID": "a"}, ops_logs / "replica_a.log")
        b = AppProcess("replica_b", {**env, "REPLICA_ID": "b"}, ops_logs / "replica_b.log")
        nginx: Nginx | None = None
        user: PageClient | None = None
        try:
            a.start(), b.start()
            a.wait_ready(), b.wait_ready()
            nginx = start_nginx("replicas", proxy_for("replicas", (a, b), "1h"))
            user = PageClient(nginx.url)
            user.signup("replicas@example.com")
            yield Cluster(a, b, nginx, database, user)
        finally:
            if user is not None:
                session_id = user.http.cookies.get("session")
                user.close()
                if session_id:  # leave the shared Redis as we found it
                    store = redis.Redis.from_url(f"{REDIS_URL}/{redis_db}")
                    keys = store.keys(f"*{session_id}*")
                    if keys:
                        store.delete(*keys)
                    store.close()
            if nginx is not None:
                nginx.stop()
            a.stop()
            b.stop()


def read_until(events: Iterator[Any], record: PageStream, *, deltas: int) -> None:
    """Read events into `record` until it holds `deltas` delta events."""
    for item in events:
        record.add(item)
        if len(record.deltas) >= deltas:
            return
    raise AssertionError(f"the stream ended early: {record.events!r}")


def read_rest(events: Iterator[Any], record: PageStream) -> PageStream:
    for item in events:
        record.add(item)
    return record


def owner_of(cluster: Cluster, message_id: str) -> str:
    replica_id = cluster.row(message_id)["replica_id"]
    assert replica_id in ("a", "b"), replica_id
    return replica_id


def test_stop_sent_to_the_other_replica_cancels_the_reply(cluster: Cluster) -> None:
    conversation = cluster.user.new_conversation()
    record = PageStream()
    with cluster.user.send(
        conversation, "a long one [[synthetic:tokens=1000]]", max_tokens=1000
    ) as response:
        assert response.status_code == 200
        events = iter(SseReader(response))
        read_until(events, record, deltas=3)
        message_id = record.message_id
        owner = owner_of(cluster, message_id)
        other = cluster.other(owner)
        direct = client_like(cluster.user, other.url)  # around nginx, to the wrong replica
        try:
            started = time.monotonic()
            answer = direct.cancel(message_id)
            took = time.monotonic() - started
        finally:
            direct.close()
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "cancelled", answer.json()
        read_rest(events, record)
    print(f"\nreply on {owner}, Stop sent to {other.name}: answered in {took * 1000:.0f} ms")
    assert record.end is not None and record.end.event == "final", record.events
    assert record.end.json()["status"] == "cancelled"
    row = cluster.row(message_id)
    assert row["status"] == "cancelled"
    assert row["content"] == record.text  # what the client saw is what was saved
    # The Stop landed within the reply's first tenth: a relay that never reaches the owner runs
    # it to its end (1000 tokens), one that lands only after the other replica stops waiting
    # (5 s: about 170 tokens at 30 ms) is late too.
    assert row["completion_tokens"] < 1000 // 10


def resume(client: PageClient, message_id: str, after: int) -> tuple[PageStream, float]:
    """Resume from offset `after`; the stream and when its first delta came (seconds)."""
    record = PageStream()
    with client.resume(message_id, after) as response:
        assert response.status_code == 200, response.read()
        for item in SseReader(response):
            record.add(item)
    first = record.deltas[0].at - record.started_at if record.deltas else -1.0
    return record, first


def test_resume_after_a_drop_gives_the_full_text_sticky_or_from_the_database(
    cluster: Cluster,
) -> None:
    conversation = cluster.user.new_conversation()
    seen = PageStream()
    # 130 tokens: 3.9 s. The sticky resume re-attaches to the reply on its owner within the page
    # grace (5 s); the polled one keeps it alive too, through NOTIFY attach (see the last test).
    with cluster.user.send(conversation, "resume me [[synthetic:tokens=130]]") as response:
        assert response.status_code == 200
        read_until(iter(SseReader(response)), seen, deltas=5)
    # The connection is gone (closed mid-stream); the reply carries on without a client.
    message_id, offset = seen.message_id, seen.last_id
    owner = owner_of(cluster, message_id)
    other = cluster.other(owner)
    assert cluster.row(message_id)["status"] == "streaming"

    direct = client_like(cluster.user, other.url)
    try:
        # Both at once: through nginx (sticky: the owner, live) and straight to the other replica
        # (not live there: it follows the row in the database until the reply ends).
        sticky_thread, sticky = in_thread(resume, cluster.user, message_id, offset)
        polled_thread, polled = in_thread(resume, direct, message_id, offset)
        sticky_thread.join(30), polled_thread.join(30)
    finally:
        direct.close()
    assert "error" not in sticky, sticky.get("error")
    assert "error" not in polled, polled.get("error")
    row = cluster.row(message_id)
    assert row["status"] == "completed"
    full = row["content"]
    assert len(full) > offset
    for label, (record, _first) in (("sticky", sticky["result"]), ("polled", polled["result"])):
        assert record.end is not None and record.end.json()["status"] == "completed", label
        assert seen.text + record.text == full, label
    sticky_record, polled_record = sticky["result"][0], polled["result"][0]
    print(
        f"\nreply on {owner}; after a drop at offset {offset}: resume via nginx got "
        f"{len(sticky_record.deltas)} deltas, straight to {other.name} got "
        f"{len(polled_record.deltas)} (database polling)"
    )
    assert len(sticky_record.deltas) > len(polled_record.deltas) >= 2  # both followed it live

    # Sticky: nginx sends every resume of this session to the owner (four more replays of the
    # finished reply too), never to the other replica, which only saw the direct one.
    for _ in range(4):
        replay, _first = resume(cluster.user, message_id, 0)
        assert replay.text == full
    resume_line = f"GET /api/messages/{message_id}/stream"
    assert cluster.replica(owner).log_text().count(resume_line) == 5
    assert other.log_text().count(resume_line) == 1


def test_restarting_one_replica_interrupts_only_its_own_replies(cluster: Cluster) -> None:
    on_a = client_like(cluster.user, cluster.a.url)
    on_b = client_like(cluster.user, cluster.b.url)
    record_a = PageStream()  # filled by the background reader
    thread_a = None
    try:
        # A long reply on a (1500 tokens: 45 s), read in the background until we stop it.
        conversation_a = on_a.new_conversation()

        def follow_a() -> None:
            content = "keep going [[synthetic:tokens=1500]]"
            with on_a.send(conversation_a, content, max_tokens=1500) as response:
                assert response.status_code == 200
                read_rest(iter(SseReader(response)), record_a)

        thread_a, result_a = in_thread(follow_a)
        deadline = time.monotonic() + 10
        while not record_a.deltas and time.monotonic() < deadline:
            time.sleep(0.02)
        message_a = record_a.message_id
        assert cluster.row(message_a)["replica_id"] == "a"

        # A reply on b, then b crashes mid-reply (SIGKILL: its row is left `streaming`).
        conversation_b = on_b.new_conversation()
        record_b = PageStream()
        with pytest.raises(httpx.HTTPError):
            with on_b.send(conversation_b, "doomed [[synthetic:tokens=1000]]") as response:
                events = iter(SseReader(response))
                read_until(events, record_b, deltas=2)
                cluster.b.kill()
                read_rest(events, record_b)
        message_b = record_b.message_id
        row_b = cluster.row(message_b)
        assert (row_b["status"], row_b["replica_id"]) == ("streaming", "b")

        cluster.b.start().wait_ready()  # marks b's own leftovers as interrupted at startup
        assert cluster.row(message_b)["status"] == "interrupted"
        assert cluster.row(message_a)["status"] == "streaming", "b's restart touched a's reply"
        delivered = len(record_a.deltas)
        time.sleep(0.5)
        assert len(record_a.deltas) > delivered, "a's reply stopped streaming"

        # Sessions live in Redis: b still knows this user after its restart.
        assert on_b.http.get(f"/api/conversations/{conversation_a}").status_code == 200

        answer = on_a.cancel(message_a)  # done watching: stop it (it ends `cancelled`)
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
        thread_a.join(30)
        assert "error" not in result_a, result_a.get("error")
        assert record_a.end is not None and record_a.end.json()["status"] == "cancelled"
        assert cluster.row(message_a)["content"] == record_a.text
    finally:
        if thread_a is not None and thread_a.is_alive():
            with contextlib.suppress(Exception):
                on_a.cancel(record_a.message_id)
            thread_a.join(30)
        on_a.close()
        on_b.close()


def test_a_client_following_from_the_other_replica_keeps_the_reply_alive(
    cluster: Cluster,
) -> None:
    """No sticky routing at all: after a drop, the client resumes ONLY on the replica that does
    not run the reply. That replica follows the row in the database and keeps telling the owner
    (NOTIFY attach) that a client still reads, so the owner's 5 s disconnect grace keeps
    restarting and the reply runs to its end instead of ending `disconnected`."""
    conversation = cluster.user.new_conversation()
    seen = PageStream()
    tokens = int(9.0 / (STEP_MS / 1000))  # ~9 s: well past the 5 s page grace
    with cluster.user.send(conversation, f"keep me [[synthetic:tokens={tokens}]]") as response:
        assert response.status_code == 200
        read_until(iter(SseReader(response)), seen, deltas=3)
    message_id, offset = seen.message_id, seen.last_id
    other = cluster.other(owner_of(cluster, message_id))
    direct = client_like(cluster.user, other.url)
    try:
        record, _first = resume(direct, message_id, offset)
    finally:
        direct.close()
    assert record.end is not None and record.end.json()["status"] == "completed", record.events
    row = cluster.row(message_id)
    assert row["status"] == "completed"
    assert seen.text + record.text == row["content"]


def test_a_users_events_reach_their_page_on_the_other_replica(cluster: Cluster) -> None:
    """One page on replica b hears what the same user does on replica a (relayed over NOTIFY):
    a new conversation, its rename, a reply starting (which the page follows from b, through the
    database, and stops) and its end."""
    on_a = client_like(cluster.user, cluster.a.url)
    on_b = client_like(cluster.user, cluster.b.url)
    try:
        with on_b.http.stream("GET", "/api/events") as push:
            assert push.status_code == 200
            pushed = (e for e in SseReader(push) if not isinstance(e, SseComment))
            conversation = on_a.new_conversation()
            assert next(pushed).json() == {
                "event": "conversation_created",
                "conversation_id": conversation,
                "title": "New chat",
            }
            renamed = on_a.http.patch(
                f"/api/conversations/{conversation}",
                json={"title": "Across replicas"},
                headers=on_a.csrf_headers(),
            )
            assert renamed.status_code == 200, renamed.text
            assert next(pushed).json() == {
                "event": "conversation_renamed",
                "conversation_id": conversation,
                "title": "Across replicas",
            }
            record = PageStream()
            with on_a.send(
                conversation, "a long one [[synthetic:tokens=1000]]", max_tokens=1000
            ) as response:
                events = iter(SseReader(response))
                read_until(events, record, deltas=1)
                started = next(pushed).json()
                assert started == {
                    "event": "reply_started",
                    "conversation_id": conversation,
                    "message_id": record.message_id,
                }
                assert on_b.cancel(record.message_id).json()["status"] == "cancelled"
                read_rest(events, record)
            assert record.end is not None and record.end.json()["status"] == "cancelled"
            assert next(pushed).json() == {
                "event": "reply_ended",
                "conversation_id": conversation,
                "message_id": record.message_id,
                "status": "cancelled",
            }
    finally:
        on_a.close()
        on_b.close()
