"""Delivery pacing through a real server (app/streaming/pacing.py, wired from the settings).

The synthetic engine makes a token every 2 ms, and DELIVERY_LOOP_BUSY=0.01 calls the event loop
busy at almost any work, so pacing turns on as soon as the reply streams: the page's SSE stream
then carries far fewer `delta` events than tokens, each one several tokens merged, the text whole
and equal to what was stored, and /metrics counts the merged deltas and shows the tick. Only the
pacing is under test, not a database: SQLite alone.
"""

from __future__ import annotations

import re

import pytest

from tests.live_server import PageClient, read_stream

TOKENS = 1000
TICK_MAX_MS = 200


@pytest.fixture(scope="module", params=["sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {
        "SYNTHETIC_STEP_MS": 2,
        "DELIVERY_LOOP_BUSY": 0.01,
        "DELIVERY_TICK_MAX_MS": TICK_MAX_MS,
    }


def sample(body: str, name: str, default: float | None = None) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    if match is None and default is not None:
        return default  # a labelled series exists from its first use
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


def test_a_busy_loop_sends_each_client_fewer_larger_events(alice: PageClient) -> None:
    merged_before = sample(
        alice.http.get("/metrics").text, 'streamchat_coalesced_deltas_total{transport="sse"}', 0.0
    )
    conversation = alice.new_conversation()
    prompt = f"[[synthetic:tokens={TOKENS}]] Go"
    with alice.send(conversation, prompt, max_tokens=TOKENS + 10) as response:
        record = read_stream(response)
    body = alice.http.get("/metrics").text

    assert record.end is not None and record.end.event == "final"
    final = record.end.json()
    assert final["status"] == "completed" and final["usage"]["completion_tokens"] == TOKENS
    assert record.text == alice.wait_final(conversation, record.message_id)["content"]
    deltas = record.deltas
    assert len(deltas) < TOKENS / 4, f"{len(deltas)} events for {TOKENS} tokens: not paced"
    merged = sample(body, 'streamchat_coalesced_deltas_total{transport="sse"}') - merged_before
    assert merged >= TOKENS / 2, merged
    assert 0 <= sample(body, "streamchat_delivery_tick_seconds") <= TICK_MAX_MS / 1000
