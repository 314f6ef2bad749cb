"""The llama.cpp engine with a KV stream per sequence (ENGINE_KV_LAYOUT=streams), against the real
SmolLM2-135M on CPU: greedy replies that do not depend on the load, and the host-memory prefix
cache (app/engine/llamacpp/host_cache.py). The unified pool's tests are in test_llamacpp.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.engine.base import EngineError, FinishReason, SamplingParams
from app.engine.llamacpp.engine import LlamaCppEngine
from app.settings import EngineSettings
from app.streaming.metrics import EngineCollector
from tests.engine.streams import collect

module_loop = pytest.mark.asyncio(loop_scope="module")

SETTINGS = EngineSettings(max_seqs=4, kv_cells=4096, threads=2, kv_layout="streams")
NOTES = "Here are my notes: " + " ".join(
    f"item {i} is {'blue' if i % 3 else 'red'};" for i in range(70)
)
TOPICS = ["a lighthouse keeper", "a dragon who fears fire", "a desert journey", "a cat as mayor"]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    eng = LlamaCppEngine(SETTINGS)
    await eng.start()
    yield eng
    await eng.shutdown()


@module_loop
async def test_each_sequence_has_its_stream_less_a_cell_for_a_pad(engine: LlamaCppEngine) -> None:
    assert engine.context_size == 4096 // 4 - 1
    assert engine.stats().kv_total == 4096


@module_loop
async def test_a_stream_under_256_cells_is_refused_at_start() -> None:
    eng = LlamaCppEngine(EngineSettings(max_seqs=64, kv_cells=8192, kv_layout="streams"))
    with pytest.raises(EngineError, match="ENGINE_KV_CELLS / ENGINE_MAX_SEQS"):
        await eng.start()


@module_loop
async def test_greedy_replies_over_long_prompts_match_each_alone(engine: LlamaCppEngine) -> None:
    """Four ~525-token prompts, 150 greedy tokens each, one at a time and then together: the
    same text. A sequence decoding alone is one row of one stream, which ggml's flash attention
    splits across threads once its stream holds 512+ cells (`stream_calls`): checked to fail
    (all four differ) when the pad rows and lent tokens are turned off."""
    params = SamplingParams(max_tokens=150, temperature=0.0)
    prompts = [chat(f"{NOTES} Now write a story about {topic}.") for topic in TOPICS]
    padded = engine.stats().extra["padded_steps"]
    alone = [
        await collect(engine.generate(f"alone-{i}", p, params, owner=f"a{i}"))
        for i, p in enumerate(prompts)
    ]
    assert engine.stats().extra["padded_steps"] - padded >= 4 * 100
    together = await asyncio.gather(
        *(
            collect(engine.generate(f"together-{i}", p, params, owner=f"t{i}"))
            for i, p in enumerate(prompts)
        )
    )
    for i, ((text, _, fin), (again, _, _)) in enumerate(zip(alone, together, strict=True)):
        assert fin.prompt_tokens > 512 and fin.completion_tokens == 150
        assert again == text, f"prompt {i} differs when batched"
    assert len({text for text, _, _ in alone}) == len(prompts)


@module_loop
async def test_the_previous_turn_comes_back_from_host_memory(engine: LlamaCppEngine) -> None:
    """A conversation's second turn restores its first turn's saved state and prefills only what
    follows; the reply is the one a cold engine gives; the cache is visible in /metrics."""
    params = SamplingParams(max_tokens=16, temperature=0.0)
    first = chat("Name a large animal that lives in the ocean.")
    reply, _, fin1 = await collect(engine.generate("turn-1", first, params, owner="ann"))
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    before = engine.stats().prefix_cache
    assert before is not None and before.host_bytes > 0
    warm, _, fin2 = await collect(engine.generate("turn-2", second, params, owner="ann"))
    after = engine.stats().prefix_cache
    assert after is not None and after.hits == before.hits + 1
    assert after.reused_tokens - before.reused_tokens >= fin1.prompt_tokens
    assert fin2.reason in (FinishReason.LENGTH, FinishReason.STOP)

    cold_engine = LlamaCppEngine(SETTINGS, prefix_cache=0)
    await cold_engine.start()
    try:
        cold, _, _ = await collect(cold_engine.generate("cold", second, params, owner="ann"))
        stats = cold_engine.stats().prefix_cache
        assert stats is not None and (stats.hits, stats.entries) == (0, 0)
    finally:
        await cold_engine.shutdown()
    assert warm == cold

    metrics = {m.name: m.samples[0].value for m in EngineCollector(engine.stats).collect()}
    assert metrics["streamchat_prefix_cache_hits"] == after.hits
    assert metrics["streamchat_prefix_cache_host_bytes"] == after.host_bytes > 0


@module_loop
async def test_another_owners_identical_prompt_reuses_only_the_opening(
    engine: LlamaCppEngine,
) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    secret = chat("My locker code is 4417; remind me of it tomorrow morning, please.")

    async def reused_by(rid: str, owner: str) -> tuple[int, int]:
        before = engine.stats().extra["prefix_reused_tokens"]
        _, _, fin = await collect(engine.generate(rid, secret, params, owner=owner))
        return int(engine.stats().extra["prefix_reused_tokens"] - before), fin.prompt_tokens

    await reused_by("alice-1", "alice")
    bob, prompt_tokens = await reused_by("bob-1", "bob")
    alice, _ = await reused_by("alice-2", "alice")
    opening = engine.stats().extra["prefix_shared_tokens"]
    assert 10 <= opening < prompt_tokens - 15
    assert bob == opening
    assert alice == prompt_tokens - 1


@module_loop
async def test_the_cache_stays_within_its_bytes() -> None:
    """ENGINE_PREFIX_CACHE_MB=3 holds a few short conversations' states (~23 KB a token for
    SmolLM2, ~1 MB each here): older owners' entries are dropped, least recently used first."""
    eng = LlamaCppEngine(dataclasses.replace(SETTINGS, prefix_cache_mb=3))
    await eng.start()
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0)
        for i in range(6):
            await collect(
                eng.generate(f"b{i}", chat(f"Tell me about the number {i}."), params, owner=f"u{i}")
            )
        stats = eng.stats().prefix_cache
        assert stats is not None and 0 < stats.host_bytes <= 3 << 20
        assert 2 <= stats.entries < 7  # the opening and the newest ones
    finally:
        await eng.shutdown()


@module_loop
async def test_a_saved_state_that_will_not_restore_costs_a_prefill_not_the_reply(
    engine: LlamaCppEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp refuses a state it cannot read (llama_state_seq_set_data returns 0): the
    request prefills its whole prompt instead and its reply is the one a cached prefix gives."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    question = chat("What do owls eat at night?")
    expected, _, _ = await collect(engine.generate("owl-1", question, params, owner="olga"))
    host = engine._host_cache  # the engine's own cache: the one place to break a saved state
    assert host is not None
    for entry in host.entries:
        if entry.owner == "olga":
            del entry.state[64:]
    again, _, fin = await collect(engine.generate("owl-2", question, params, owner="olga"))
    assert fin.reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert again == expected
    assert "could not restore a cached prefix" in caplog.text
