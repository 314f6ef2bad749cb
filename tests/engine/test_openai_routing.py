"""ENGINE=openai's bookkeeping without a server: routing across upstreams, up and down, and the
wire format (what app/engine/openai/engine.py does with them runs against real llama-servers in
tests/engine/test_engine_contract.py and tests/serving/test_live_remote_engine.py)."""

from __future__ import annotations

import pytest

from app.engine.base import SamplingParams
from app.engine.openai.sampling import sampling_fields
from app.engine.openai.stream import UpstreamProtocolError, chat_body, error_message, parse_chunk
from app.engine.openai.upstreams import Upstream, UpstreamPool


def pool_of(*capacities: int, failures_to_down: int = 2) -> UpstreamPool:
    pool = UpstreamPool(
        (Upstream(f"http://u{i}/v1", c) for i, c in enumerate(capacities)),
        failures_to_down=failures_to_down,
    )
    for upstream in pool:
        pool.probe_succeeded(upstream)
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
    assert pool.probe_failed(a, "refused") is False  # one failure: still up
    pool.probe_succeeded(a)
    assert pool.probe_failed(a, "refused") is False  # the count restarted
    assert pool.probe_failed(a, "refused again") is True
    assert not a.up and pool.pick() is b and pool.unavailable() is None
    pool.probe_failed(b, "timeout")
    pool.probe_failed(b, "timeout")
    why = pool.unavailable()
    assert why is not None and "http://u0/v1 (refused again)" in why and "u1" in why
    assert pool.probe_succeeded(a) is True and pool.pick() is a


def test_good_health_checks_do_not_wipe_out_failed_requests() -> None:
    """A wedged server answers its health check but serves nothing: its failed requests (first-token
    timeouts) still add up, and once back it is tried last and dropped at its next failure."""
    pool = pool_of(1, 1, failures_to_down=2)
    hung, good = pool.upstreams
    assert pool.request_failed(hung, "no first token within 60 s") is False
    pool.probe_succeeded(hung)  # the probe between the two timeouts
    assert pool.request_failed(hung, "no first token within 60 s") is True
    assert not hung.up and pool.pick() is good
    assert pool.probe_succeeded(hung) is True  # answers its checks: back, but suspect
    good.requests = 5  # even though the good one has served more
    assert pool.pick() is good
    good.in_flight = 1  # full: only now the suspect one, one request at a time
    assert pool.pick() is hung
    hung.capacity, hung.in_flight = 4, 1
    assert pool.pick() is None
    hung.in_flight = 0
    assert pool.request_failed(hung, "no first token within 60 s") is True  # at once
    pool.probe_succeeded(hung)
    pool.producing(hung)  # a token: no longer suspect
    good.in_flight = 0
    good.requests, hung.requests = 5, 0
    assert pool.pick() is hung


def test_degraded_names_the_down_upstreams_while_others_serve() -> None:
    pool = pool_of(1, 1, 1, failures_to_down=1)
    a, b, c = pool.upstreams
    assert pool.degraded() is None
    pool.probe_failed(b, "health check: ConnectError")
    assert pool.degraded() == "1 of 3 upstreams down: http://u1/v1 (health check: ConnectError)"
    pool.probe_failed(a, "x")
    pool.probe_failed(c, "y")
    assert pool.degraded() is None and pool.unavailable() is not None  # not degraded: down


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
    assert (body["max_tokens"], body["stop"]) == (9, ["\n\n"])
    chunk = parse_chunk('{"choices":[{"delta":{"content":"Hé"},"finish_reason":null}]}')
    assert (chunk.text, chunk.finish_reason, chunk.usage) == ("Hé", None, None)
    last = parse_chunk('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}')
    assert last.usage == {"prompt_tokens": 3, "completion_tokens": 9} and last.text == ""
    with pytest.raises(UpstreamProtocolError, match="out of memory"):
        parse_chunk('{"error":{"message":"out of memory","code":500}}')
    with pytest.raises(UpstreamProtocolError):
        parse_chunk("not json")
    assert error_message(b'{"error":{"message":"context exceeded"}}') == "context exceeded"


PARAMS = SamplingParams(
    max_tokens=50, temperature=0.8, top_p=0.9, top_k=0, seed=7, min_p=0.02,
    frequency_penalty=0.3, presence_penalty=0.2, repeat_penalty=1.15,
)  # fmt: skip
OPENAI = {"temperature": 0.8, "top_p": 0.9, "frequency_penalty": 0.3, "presence_penalty": 0.2,
          "seed": 7}  # fmt: skip


def test_every_sampling_field_goes_by_each_servers_own_name() -> None:
    """Every field reaches the upstream, "off" included, in the words its server reads: top_k 0
    left out would be llama-server's 40 and min_p its 0.05; trtllm-serve refuses names it does
    not know; SGLang refuses top_k 0."""
    assert sampling_fields(PARAMS, "llamacpp") == {
        **OPENAI, "top_k": 0, "min_p": 0.02, "repeat_penalty": 1.15, "repeat_last_n": 50,
    }  # fmt: skip
    for server, top_k_off in (("vllm", -1), ("sglang", -1), ("tensorrt_llm", 0)):
        assert sampling_fields(PARAMS, server) == {
            **OPENAI, "top_k": top_k_off, "min_p": 0.02, "repetition_penalty": 1.15,
        }, server  # fmt: skip
    assert sampling_fields(PARAMS, "")["repetition_penalty"] == 1.15
    # an unknown server is sent the extensions only where they do something
    plain = sampling_fields(SamplingParams(temperature=0.5, top_k=0), "nvidia")
    assert plain == {"temperature": 0.5, "top_p": 1.0, "frequency_penalty": 0.0,
                     "presence_penalty": 0.0}  # fmt: skip
    assert sampling_fields(SamplingParams(top_k=3), "vllm")["top_k"] == 3
