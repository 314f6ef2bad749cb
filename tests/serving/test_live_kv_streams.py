"""A server whose llama.cpp engine keeps a KV stream per sequence (ENGINE_KV_LAYOUT=streams):
conversations through the page, their prefixes kept in host memory per user, and the cache's
figures in /metrics. On SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest

from tests.live_server import PageClient, read_stream


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {
        "DEFAULT_MAX_TOKENS": 24,
        "ENGINE_KV_LAYOUT": "streams",
        "ENGINE_MAX_SEQS": 4,
        "ENGINE_KV_CELLS": 4096,
        "ENGINE_THREADS": 2,
    }


def metric(client: PageClient, name: str) -> float:
    body = client.http.get("/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", body, re.MULTILINE)
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


def send(client: PageClient, conversation: str, text: str) -> str:
    with client.send(conversation, text, max_tokens=24) as response:
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final", record
    return record.end.json()["status"]


def test_a_second_turn_starts_from_the_first_turns_saved_state(
    alice: PageClient, bob: PageClient
) -> None:
    """Alice's second turn restores her first turn's KV state from host memory (a hit, most of
    its prompt reused); Bob sending the same first message reuses only the template's opening
    that everybody shares; the cache's hits and host memory show in /metrics."""
    question = "Tell me one fact about honeybees, please."
    assert alice.engine_stats()["kv_total"] == 4096
    conversation = alice.new_conversation()
    assert send(alice, conversation, question) in ("completed", "length")
    alice.wait_engine_idle()
    before = alice.engine_stats()["prefix_cache"]
    assert send(alice, conversation, "Why is that?") in ("completed", "length")
    alice.wait_engine_idle()
    after = alice.engine_stats()["prefix_cache"]
    assert after["hits"] == before["hits"] + 1
    assert after["reused_tokens"] - before["reused_tokens"] >= 40  # the first turn, not just 24
    assert metric(alice, "streamchat_prefix_cache_hits_total") == after["hits"]
    assert metric(alice, "streamchat_prefix_cache_host_bytes") > 0
    # a stream's window: its own cells only, in 256-cell blocks, at most the stream
    walked = alice.engine_stats()["kv_walked"]
    assert walked in (256, 512) and metric(alice, "streamchat_engine_kv_cells_walked") == walked

    shared = alice.engine_stats()["extra"]["prefix_shared_tokens"]
    assert shared >= 10
    bobs = bob.new_conversation()
    assert send(bob, bobs, question) in ("completed", "length")
    alice.wait_engine_idle()
    bobs_reuse = alice.engine_stats()["prefix_cache"]["reused_tokens"] - after["reused_tokens"]
    assert bobs_reuse == shared
