"""ENGINE=openai's bookkeeping without a server: routing across upstreams, up and down, and the
wire format (what app/engine/openai/engine.py does with them runs against real llama-servers in
tests/engine/test_engine_contract.py and tests/serving/test_live_remote_engine.py)."""

from __future__ import annotations

import pytest

from app.engine.base import SamplingParams
from app.engine.openai.stream import UpstreamProtocolError, chat_body, error_message, parse_chunk
from app.engine.openai.upstreams import Upstream, UpstreamPool


def pool_of(*capacities: int, failures_to_down: int = 2) -> UpstreamPool:
    pool = UpstreamPool(
        (Upstream(f"http://u{i}/v1", c) for i, c in enumerate(capacities)),
        failures_to_down=failures_to_down,
    )
    for upstream in pool:
        pool.succeeded(upstream)
    return pool


def test_the_least_loaded_upstream_with_room_is_picked() -> None:
    pool = pool_of(2, 2)
    a, b = pool.upstreams
    picked = []
    for _ in range(4):
        upstream = pool.pick()
        assert upstream is not None
        upstream.in_flight += 1
        upstream.requests += 1
        picked.append(upstream)
    assert picked == [a, b, a, b]
    assert pool.pick() is None  # every slot taken: the request waits in the app
    b.in_flight -= 1
    assert pool.pick() is b
    assert pool.pick(exclude=[b]) is None  # a failover never goes back to where it failed


def test_an_upstream_is_down_after_failures_in_a_row_and_back_when_it_answers() -> None:
    pool = pool_of(1, 1, failures_to_down=2)
    a, b = pool.upstreams
    assert pool.failed(a, "refused") is False  # one failure: still up
    pool.succeeded(a)
    assert pool.failed(a, "refused") is False  # the count restarted
    assert pool.failed(a, "refused again") is True
    assert not a.up and pool.pick() is b and pool.unavailable() is None
    pool.failed(b, "timeout")
    pool.failed(b, "timeout")
    why = pool.unavailable()
    assert why is not None and "http://u0/v1 (refused again)" in why and "u1" in why
    assert pool.succeeded(a) is True and pool.pick() is a


def test_ttft_is_counted_in_cumulative_buckets() -> None:
    upstream = Upstream("http://u/v1", 1)
    for seconds in (0.004, 0.2, 0.2, 40.0):
        upstream.record_ttft(seconds)
    stats = upstream.stats()
    assert stats.ttft_count == 4 and stats.ttft_sum_s == pytest.approx(40.404)
    buckets = dict(stats.ttft_buckets)
    assert (buckets[0.005], buckets[0.1], buckets[0.25], buckets[30.0]) == (1, 1, 3, 3)


def test_the_request_body_and_the_chunks() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.0, seed=4, stop=("\n\n",), top_k=5)
    body = chat_body("m", [{"role": "user", "content": "hi"}], params)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["seed"], body["stop"], body["top_k"]) == (9, 4, ["\n\n"], 5)
    chunk = parse_chunk('{"choices":[{"delta":{"content":"Hé"},"finish_reason":null}]}')
    assert (chunk.text, chunk.finish_reason, chunk.usage) == ("Hé", None, None)
    last = parse_chunk('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}')
    assert last.usage == {"prompt_tokens": 3, "completion_tokens": 9} and last.text == ""
    with pytest.raises(UpstreamProtocolError, match="out of memory"):
        parse_chunk('{"error":{"message":"out of memory","code":500}}')
    with pytest.raises(UpstreamProtocolError):
        parse_chunk("not json")
    assert error_message(b'{"error":{"message":"context exceeded"}}') == "context exceeded"
