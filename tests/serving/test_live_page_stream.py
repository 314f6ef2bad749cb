"""The page's SSE stream against a real server and the real SmolLM2 model (ENGINE=llamacpp), and
the same over the TensorRT-LLM adapter on the FAKE `tensorrt_llm` (ENGINE=trtllm, no GPU here).

These are the behaviours that only mean something with a real model behind them: deltas that arrive
while the model is still decoding, Stop landing mid-decode with the engine freed, a dropped client
becoming `disconnected` after the page grace, and resume (live and finished) giving exactly the
stored text. Each runs on SQLite and on PostgreSQL. Greedy decoding (temperature 0, fixed seed) and
small `max_tokens` keep them short and repeatable.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from itertools import islice
from typing import Any

import httpx_sse
import pytest
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine
from tests.live_server import LiveServer, PageClient, PageStream, SseEvent, SseReader, read_stream
from tests.serving.conftest import unique_email

PAGE_GRACE_S = 2.0  # BASE_ENV's PAGE_GRACE_S
STORY = "Write a long story about a dragon."  # SmolLM2 goes on and on at temperature 0
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7}


@pytest.fixture(scope="module", params=["llamacpp", "trtllm-fake"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    """Real SmolLM2 on llama.cpp, and the TensorRT-LLM adapter over the FAKE `tensorrt_llm`
    (tests/fakes/tensorrt_llm/: TensorRT-LLM needs a GPU)."""
    return request.param


def take_deltas(reader: SseReader, record: PageStream, count: int) -> None:
    """Read events into `record` until it holds `count` deltas."""
    for item in reader:
        event = record.add(item)
        if event is not None and event.event in ("final", "error"):
            raise AssertionError(f"the reply ended after {len(record.deltas)} deltas: {event!r}")
        if len(record.deltas) >= count:
            return
    raise AssertionError("the stream ended without a final event")


def assert_offsets(events: list[SseEvent], start_offset: int = 0) -> None:
    """Every delta's id is the character offset where its text ends."""
    offset = start_offset
    for event in events:
        if event.event == "delta":
            offset += len(event.json()["text"])
            assert int(event.id or -1) == offset, (event, offset)


def stored_reply(client: PageClient, record: PageStream) -> dict[str, Any]:
    return client.wait_final(record.start["conversation_id"], record.message_id)


def test_deltas_arrive_while_the_model_is_still_decoding(alice: PageClient) -> None:
    """The reply reaches the client token by token: most deltas arrive well before the final
    event (nothing buffers the stream), ids are character offsets, and the stored text is the
    streamed text."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=48, **GREEDY) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        record = read_stream(response)

    names = [e.event for e in record.events]
    assert names[0] == "start" and names[-1] == "final"
    assert set(names[1:-1]) == {"delta"}
    final = record.events[-1]
    first_delta = record.deltas[0]
    assert len(record.deltas) >= 10
    assert final.at - first_delta.at > 0.3, "the deltas came in one burst with the final"
    early = [d for d in record.deltas if final.at - d.at > 0.05]
    assert len(early) >= len(record.deltas) // 2, "most deltas arrived only with the final"
    assert_offsets(record.events)
    assert int(final.id or -1) == len(record.text)
    assert final.json()["status"] in ("length", "completed")

    stored = stored_reply(alice, record)
    assert stored["content"] == record.text
    assert stored["status"] == final.json()["status"]
    assert stored["completion_tokens"] == final.json()["usage"]["completion_tokens"] <= 48


def test_httpx_sse_parses_the_page_stream(alice: PageClient) -> None:
    """A stock SSE client (httpx-sse) reads our stream: named events, numeric ids, JSON data."""
    conversation = alice.new_conversation()
    with httpx_sse.connect_sse(
        alice.http,
        "POST",
        f"/api/conversations/{conversation}/messages",
        json={"content": "Name three colours.", "max_tokens": 16, **GREEDY},
        headers=alice.csrf_headers(),
    ) as source:
        events = list(source.iter_sse())

    assert events[0].event == "start"
    assert events[-1].event == "final"
    assert {e.event for e in events[1:-1]} == {"delta"}
    assert all(e.id.isdigit() for e in events)
    start, final = events[0].json(), events[-1].json()
    assert start["conversation_id"] == conversation and start["offset"] == 0
    text = "".join(e.json()["text"] for e in events if e.event == "delta")
    assert int(events[-1].id) == len(text)
    assert {"status", "finish_reason", "usage", "timings", "error"} <= final.keys()
    assert alice.wait_final(conversation, start["message_id"])["content"] == text


def test_stop_saves_exactly_what_the_client_saw(alice: PageClient) -> None:
    """Stop mid-reply: the cancel call answers `cancelled` once the end is saved, the stream ends
    with a `cancelled` final, the stored text equals the text the client received, and the engine
    runs nothing any more."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=400, **GREEDY) as response:
        reader, record = SseReader(response), PageStream()
        take_deltas(reader, record, 5)
        cancelled = alice.cancel(record.message_id)
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert alice.engine_stats()["running"] == 0
        read_stream(reader, record)

    assert record.end is not None and record.end.event == "final"
    assert record.end.json()["status"] == "cancelled"
    assert_offsets(record.events)
    stored = stored_reply(alice, record)
    assert stored["status"] == "cancelled"
    assert stored["content"] == record.text
    assert stored["cancel_token_index"] is not None
    assert stored["completion_tokens"] < 400
    assert alice.cancel(record.message_id).json()["status"] == "cancelled"  # idempotent


def test_a_dropped_client_is_disconnected_after_the_grace(alice: PageClient) -> None:
    """A client that closes the connection mid-reply: the reply keeps going for the page grace
    (so the client could resume), then ends `disconnected` with the engine freed; what is stored
    starts with what the client saw."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=400, **GREEDY) as response:
        reader, record = SseReader(response), PageStream()
        take_deltas(reader, record, 3)
    dropped_at = time.time()

    time.sleep(PAGE_GRACE_S / 4)
    assert alice.message(conversation, record.message_id)["status"] == "streaming"
    stored = alice.wait_final(conversation, record.message_id)
    assert stored["status"] == "disconnected"
    finished_at = datetime.fromisoformat(stored["finished_at"]).timestamp()
    assert finished_at - dropped_at >= PAGE_GRACE_S * 0.8
    assert stored["content"].startswith(record.text)
    assert len(stored["content"]) > len(record.text)  # it went on during the grace
    assert alice.wait_engine_idle(timeout_s=5)["running"] == 0


def test_resume_after_a_drop_gives_exactly_the_full_text(alice: PageClient) -> None:
    """Drop the stream, then resume with Last-Event-ID = the last id seen: the resumed stream
    starts at that offset, and what was seen before plus after is the stored text, with nothing
    twice and nothing missing."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=64, **GREEDY) as response:
        first = PageStream()
        take_deltas(SseReader(response), first, 5)

    with alice.resume(first.message_id, first.last_id) as response:
        second = read_stream(response)

    assert second.start["offset"] == first.last_id
    assert second.events[0].id == str(first.last_id)
    assert_offsets(second.events, start_offset=first.last_id)
    assert second.end is not None and second.end.event == "final"
    stored = stored_reply(alice, first)
    assert first.text + second.text == stored["content"]
    assert stored["status"] in ("length", "completed")


def test_resume_of_a_finished_reply_replays_to_the_end(alice: PageClient) -> None:
    """A finished reply resumes from the database: from any offset the replay is exactly the rest
    of the stored text, then the stored final; past the end there is only the final."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=24, **GREEDY) as response:
        original = read_stream(response)
    stored = stored_reply(alice, original)
    full = stored["content"]
    assert full == original.text and len(full) > 20

    for after in (None, 0, 1, 10, len(full) - 1, len(full), len(full) + 50):
        with alice.resume(original.message_id, after) as response:
            replay = read_stream(response)
        offset = min(after or 0, len(full))
        assert replay.start["offset"] == offset
        assert replay.text == full[offset:], after
        assert replay.end is not None and replay.end.json()["status"] == stored["status"]
        assert int(replay.end.id or -1) == len(full)


def test_stop_on_a_resumed_stream(alice: PageClient) -> None:
    """Stop works on a stream that was resumed after a drop: the reply ends `cancelled`, and the
    text seen over both connections is exactly the stored text."""
    conversation = alice.new_conversation()
    with alice.send(conversation, STORY, max_tokens=400, **GREEDY) as response:
        first = PageStream()
        take_deltas(SseReader(response), first, 3)

    with alice.resume(first.message_id, first.last_id) as response:
        reader, second = SseReader(response), PageStream()
        take_deltas(reader, second, 3)
        assert alice.cancel(first.message_id).json()["status"] == "cancelled"
        read_stream(reader, second)

    assert second.end is not None and second.end.json()["status"] == "cancelled"
    stored = stored_reply(alice, first)
    assert stored["status"] == "cancelled"
    assert first.text + second.text == stored["content"]
    assert alice.engine_stats()["running"] == 0


def test_a_send_from_a_deleted_account_is_not_logged_in(
    server: LiveServer, live_database_url: str
) -> None:
    """The send route reads no user row of its own (its one query checks the user): a session
    whose account was deleted since is still answered 401, and nothing is written or started."""
    gone = PageClient(server.url)
    try:
        gone.signup(unique_email("gone"))
        conversation = gone.new_conversation()
        delete_user(live_database_url, gone.email or "")
        with gone.send(conversation, "Anyone there?", max_tokens=4) as response:
            assert response.status_code == 401
            assert response.read() and response.json()["detail"] == "log in first"
        assert gone.http.get("/api/me").status_code == 401  # as routes reading the user answer
    finally:
        gone.close()


def delete_user(database_url: str, email: str) -> None:
    """Delete an account straight in the database (its conversations go with it)."""

    async def run() -> None:
        engine = create_engine(database_url, poolclass=NullPool)  # SQLite: foreign keys on
        try:
            async with engine.begin() as connection:
                await connection.execute(text("DELETE FROM users WHERE email = :e"), {"e": email})
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_another_users_ids_and_the_resumed_stream_headers(
    alice: PageClient, bob: PageClient
) -> None:
    """Bob cannot resume or stop Alice's reply (404, as if it did not exist), and the resume
    stream is served as an uncached event stream."""
    conversation = alice.new_conversation()
    with alice.send(conversation, "Say hi.", max_tokens=8, **GREEDY) as response:
        record = read_stream(response)
    with bob.resume(record.message_id, 0) as response:
        assert response.status_code == 404
    assert bob.cancel(record.message_id).status_code == 404
    with alice.resume(record.message_id, 0) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        assert [e.event for e in islice(SseReader(response), 1)] == ["start"]
