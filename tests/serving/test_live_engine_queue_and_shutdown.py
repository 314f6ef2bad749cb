"""Stop of a reply that still waits for an engine slot, and shutdown with replies in flight, against
a real server: on llama.cpp with the real SmolLM2 model and on the TensorRT-LLM adapter over the
FAKE `tensorrt_llm` (tests/fakes/tensorrt_llm/: TensorRT-LLM needs a GPU; the fake drops a
cancelled request that waits in its queue without any response, as TensorRT-LLM 1.x does).
Each on SQLite and PostgreSQL; the engine runs one sequence at a time (ENGINE_MAX_SEQS=1).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from app.engine.trtllm.engine import ABORT_GRACE_S
from tests.live_databases import migrated_database
from tests.live_server import (
    LiveServer,
    PageClient,
    PageStream,
    SseReader,
    query,
    read_stream,
    server_env,
    uuid_text,
)
from tests.serving.conftest import unique_email

STORY = "Write a long story about a dragon."
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}


@pytest.fixture(scope="module", params=["llamacpp", "trtllm-fake"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"DEFAULT_MAX_TOKENS": 32, "ENGINE_MAX_SEQS": 1}


def first_deltas(reader: SseReader, record: PageStream, count: int) -> None:
    for item in reader:
        event = record.add(item)
        assert event is None or event.event not in ("final", "error"), event
        if len(record.deltas) >= count:
            return
    raise AssertionError("the stream ended early")


def test_stop_of_a_queued_reply_ends_it_cancelled_at_once(alice: PageClient) -> None:
    """With one engine slot busy, a second reply waits in the engine's queue. Stop on it answers
    `cancelled` with nothing generated (its partial text, empty, saved), leaves the running reply
    untouched, and after Stop on that one too the engine runs nothing."""
    busy, waiting = alice.new_conversation(), alice.new_conversation()
    with alice.send(busy, STORY, max_tokens=400, **GREEDY) as running_response:
        running_reader, running = SseReader(running_response), PageStream()
        first_deltas(running_reader, running, 3)
        with alice.send(waiting, STORY, max_tokens=400, **GREEDY) as queued_response:
            queued_reader, queued = SseReader(queued_response), PageStream()
            queued.add(next(iter(queued_reader)))  # `start`: accepted, waiting for the slot
            stopped_at = time.monotonic()
            answer = alice.cancel(queued.message_id)
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "cancelled"
            # answered before an abort deadline could have ended it: TensorRT-LLM drops a queued
            # request silently, and only the deadline would end one that waited for its answer
            assert time.monotonic() - stopped_at < ABORT_GRACE_S
            read_stream(queued_reader, queued)
        assert queued.end is not None and queued.end.json()["status"] == "cancelled"
        assert queued.text == ""
        stored = alice.wait_final(waiting, queued.message_id)
        assert (stored["status"], stored["content"]) == ("cancelled", "")
        assert alice.engine_stats()["running"] == 1  # the other reply goes on

        first_deltas(running_reader, running, 6)
        assert alice.cancel(running.message_id).json()["status"] == "cancelled"
        read_stream(running_reader, running)
    stored = alice.wait_final(busy, running.message_id)
    assert stored["status"] == "cancelled" and stored["content"] == running.text != ""
    assert alice.wait_engine_idle(timeout_s=10)["running"] == 0


def test_shutdown_with_replies_in_flight_saves_them_interrupted(
    engine_kind: str, backend: str, module_dir: Path
) -> None:
    """SIGTERM while one reply streams and another waits for the slot: the server exits on its
    own after the graceful wait (no SIGKILL needed: the engine's shutdown does not hang on the
    queued request), and both replies are saved `interrupted`, the running one with its text."""
    directory = module_dir / f"shutdown-{engine_kind}"
    directory.mkdir()
    with migrated_database(backend, directory) as url:
        env = server_env(engine_kind, url, directory, ENGINE_MAX_SEQS=1, GRACEFUL_SHUTDOWN_S=1)
        server = LiveServer(env, directory / "server.log", migrate=False).start()
        try:
            client = PageClient(server.url)
            client.signup(unique_email("shutdown"))
            ids = []
            with client.send(client.new_conversation(), STORY, max_tokens=2000, **GREEDY) as r1:
                first = PageStream()
                first_deltas(SseReader(r1), first, 3)
                with client.send(client.new_conversation(), STORY, max_tokens=2000) as r2:
                    second = PageStream()
                    second.add(next(iter(SseReader(r2))))
                    ids = [first.message_id, second.message_id]
                    assert server.process is not None
                    process = server.process
                    process.send_signal(signal.SIGTERM)
                    code = process.wait(timeout=30)
            # uvicorn re-raises the SIGTERM once it has shut down cleanly (tests/ops/test_procfile.py)
            assert code in (0, -signal.SIGTERM), server.log_tail()
            assert "Application shutdown complete." in server.log_path.read_text()
        finally:
            server.stop()
        rows = {
            uuid_text(row["id"]): row
            for row in query(
                url, "SELECT id, status, content FROM messages WHERE role = 'assistant'"
            )
        }
    assert [rows[i]["status"] for i in ids] == ["interrupted", "interrupted"]
    assert rows[ids[0]]["content"].startswith(first.text) and first.text
    assert rows[ids[1]]["content"] == ""
