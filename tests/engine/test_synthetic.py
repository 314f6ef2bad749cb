"""The synthetic engine honours the whole engine contract, cheaply and deterministically."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from app.engine import create_engine
from app.engine.base import (
    DuplicateRequestError,
    Engine,
    EngineError,
    EngineUnavailableError,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.synthetic.engine import SYNTHETIC_CONTEXT, SyntheticEngine
from app.engine.synthetic.text import prompt_token_count, render_prompt
from app.settings import EngineSettings
from tests.engine.streams import collect

FAST = EngineSettings(
    kind="synthetic",
    context_size=2048,
    synthetic_step_ms=1.0,
    synthetic_per_seq_ms=0.0,
    synthetic_prefill_ms_per_token=0.0,
)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture
async def engine() -> AsyncIterator[SyntheticEngine]:
    eng = SyntheticEngine(FAST)
    await eng.start()
    yield eng
    await eng.shutdown()


async def started(settings: EngineSettings) -> SyntheticEngine:
    eng = SyntheticEngine(settings)
    await eng.start()
    return eng


async def test_synthetic_is_an_engine_and_create_engine_builds_it() -> None:
    eng = create_engine(FAST)
    assert isinstance(eng, SyntheticEngine)
    assert isinstance(eng, Engine)
    assert eng.model_name == "synthetic"
    assert eng.context_size == FAST.context_size


async def test_reply_is_deterministic_and_multibyte(engine: SyntheticEngine) -> None:
    params = SamplingParams(max_tokens=400, seed=7)
    a, _, fa = await collect(engine.generate("a", user("hello there"), params))
    b, _, fb = await collect(engine.generate("b", user("hello there"), params))
    c, _, _ = await collect(engine.generate("c", user("hello there"), replace(params, seed=8)))
    d, _, _ = await collect(engine.generate("d", user("something else"), params))
    assert a == b and fa.completion_tokens == fb.completion_tokens
    assert a != c and a != d
    everything = a + c + d
    assert any(ord(ch) > 0x7F for ch in everything)
    assert "\ufffd" not in everything  # tokens split characters, the detokenizer rejoins them
    # over a few replies every script family shows up: accents, CJK, emoji, right-to-left
    texts = [(await collect(engine.generate(f"m{i}", user(f"q{i}"), params)))[0] for i in range(8)]
    joined = "".join(texts)
    assert any("\u00c0" <= ch <= "\u00ff" for ch in joined)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in joined)
    assert any(ord(ch) >= 0x1F300 for ch in joined)
    assert any("\u0590" <= ch <= "\u06ff" for ch in joined)


async def test_events_carry_tokens_and_timestamps(engine: SyntheticEngine) -> None:
    before = time.time()
    text, deltas, fin = await collect(engine.generate("r", user("hi"), SamplingParams()))
    assert fin.reason is FinishReason.STOP  # ends on its own below max_tokens=256
    assert fin.prompt_tokens == prompt_token_count(render_prompt(user("hi")))
    shown = sum(len(d.token_ids) for d in deltas)
    assert 0 < shown <= fin.completion_tokens <= 256
    assert all(d.text for d in deltas)
    assert before <= fin.queued_at <= fin.first_token_at <= fin.finished_at  # type: ignore[operator]
    assert text


async def test_max_tokens_ends_with_length(engine: SyntheticEngine) -> None:
    _, _, fin = await collect(engine.generate("r", user("hi"), SamplingParams(max_tokens=5)))
    assert fin.reason is FinishReason.LENGTH
    assert fin.completion_tokens == 5


async def test_tokens_marker_forces_reply_length(engine: SyntheticEngine) -> None:
    msg = user("load test [[synthetic:tokens=300]]")
    _, _, fin = await collect(engine.generate("r", msg, SamplingParams(max_tokens=1000)))
    assert (fin.reason, fin.completion_tokens) == (FinishReason.STOP, 300)
    _, _, cut = await collect(engine.generate("s", msg, SamplingParams(max_tokens=10)))
    assert (cut.reason, cut.completion_tokens) == (FinishReason.LENGTH, 10)


async def test_markdown_marker_writes_markdown_blocks(engine: SyntheticEngine) -> None:
    msg = user("show me [[synthetic:markdown]] [[synthetic:tokens=1500]]")
    params = SamplingParams(max_tokens=1500)
    text, _, fin = await collect(engine.generate("r", msg, params))
    assert (fin.reason, fin.completion_tokens) == (FinishReason.STOP, 1500)
    again, _, _ = await collect(engine.generate("s", msg, params))
    assert again == text  # deterministic, like the plain replies
    lines = text.splitlines()
    assert any(line.startswith("# ") or line.startswith("## ") for line in lines)
    assert sum(line.startswith("```") for line in lines) >= 6  # several fenced blocks
    assert any(line.startswith("|:---|") for line in lines)  # a GFM table
    assert any(line.startswith("   - ") for line in lines)  # a nested list
    assert any(len(code) > 60 for code in text.split("`")[1::2])  # long inline code
    plain, _, _ = await collect(engine.generate("p", user("[[synthetic:tokens=1500]]"), params))
    assert "```" not in plain


async def test_context_fills_up_with_length() -> None:
    eng = await started(replace(FAST, context_size=64))
    try:
        msg = user("x" * 100)  # about 30 tokens of prompt
        prompt_tokens = prompt_token_count(render_prompt(msg))
        _, _, fin = await collect(eng.generate("r", msg, SamplingParams(max_tokens=1000)))
        assert fin.reason is FinishReason.LENGTH
        assert fin.completion_tokens == 64 - prompt_tokens
    finally:
        await eng.shutdown()


async def test_stop_string_cuts_the_reply(engine: SyntheticEngine) -> None:
    msg = user("tell me a story [[synthetic:tokens=200]]")
    full, _, _ = await collect(engine.generate("ref", msg, SamplingParams(max_tokens=200)))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut_at = full.index(stop)
    params = SamplingParams(max_tokens=200, stop=(stop,))
    text, _, fin = await collect(engine.generate("r", msg, params))
    assert fin.reason is FinishReason.STOP
    assert text == full[:cut_at]
    assert fin.completion_tokens < 200


async def test_fail_after_marker_ends_with_error(engine: SyntheticEngine) -> None:
    msg = user("please break [[synthetic:fail-after=7]]")
    text, _, fin = await collect(engine.generate("r", msg, SamplingParams(max_tokens=100)))
    assert fin.reason is FinishReason.ERROR
    assert fin.error and "7" in fin.error
    assert fin.completion_tokens == 7
    assert text  # it streamed something before failing
    _, deltas0, fin0 = await collect(
        engine.generate("z", user("[[synthetic:fail-after=0]]"), SamplingParams())
    )
    assert (fin0.reason, fin0.completion_tokens, fin0.first_token_at) == (
        FinishReason.ERROR,
        0,
        None,
    )
    assert deltas0 == []


async def test_markers_only_count_in_the_last_user_message(engine: SyntheticEngine) -> None:
    history = [
        {"role": "user", "content": "[[synthetic:fail-after=0]]"},
        {"role": "assistant", "content": "oops"},
        {"role": "user", "content": "again [[synthetic:tokens=3]]"},
    ]
    _, _, fin = await collect(engine.generate("r", history, SamplingParams()))
    assert (fin.reason, fin.completion_tokens) == (FinishReason.STOP, 3)


def test_the_default_context_is_the_models_capped_by_the_kv_pool() -> None:
    """ENGINE_CONTEXT 0 (the default): SYNTHETIC_CONTEXT, as if the model were trained on it."""
    assert SyntheticEngine(EngineSettings(kind="synthetic")).context_size == SYNTHETIC_CONTEXT
    small = EngineSettings(kind="synthetic", kv_cells=1000)
    assert SyntheticEngine(small).context_size == 1000


async def test_bad_input_is_refused_eagerly(engine: SyntheticEngine) -> None:
    with pytest.raises(PromptTooLongError) as info:
        engine.generate("long", user("word " * 5000), SamplingParams())
    assert info.value.context_size == FAST.context_size
    with pytest.raises(EngineError):
        engine.generate("empty", [], SamplingParams())
    with pytest.raises(EngineError):
        engine.generate("role", [{"role": "robot", "content": "x"}], SamplingParams())
    stream = engine.generate("dup", user("[[synthetic:tokens=50]]"), SamplingParams())
    with pytest.raises(DuplicateRequestError):
        engine.generate("dup", user("again"), SamplingParams())
    await collect(stream)
    await collect(engine.generate("dup", user("fine once the first ended"), SamplingParams()))


async def test_not_started_and_after_shutdown_refuse() -> None:
    eng = SyntheticEngine(FAST)
    with pytest.raises(EngineUnavailableError):
        eng.generate("r", user("hi"), SamplingParams())
    await eng.start()
    await eng.shutdown()
    with pytest.raises(EngineUnavailableError):
        eng.generate("r", user("hi"), SamplingParams())


async def test_max_seqs_admits_in_fifo_order() -> None:
    eng = await started(replace(FAST, max_seqs=2, synthetic_step_ms=5.0))
    try:
        streams = [
            eng.generate(f"r{i}", user(f"[[synthetic:tokens=4]] {i}"), SamplingParams())
            for i in range(5)
        ]
        assert eng.stats().waiting == 5  # nothing runs before the loop's next turn
        await asyncio.sleep(0.002)
        stats = eng.stats()
        assert (stats.running, stats.waiting) == (2, 3)
        results = await asyncio.gather(*(collect(s) for s in streams))
        firsts = [fin.first_token_at for _, _, fin in results]
        assert firsts == sorted(firsts)  # type: ignore[type-var]
        # the third starts only after one of the first two has finished
        assert results[2][2].first_token_at >= min(  # type: ignore[operator]
            results[0][2].finished_at, results[1][2].finished_at
        )
        assert eng.stats().running == 0
    finally:
        await eng.shutdown()


async def test_waiting_requests_are_admitted_fairly_across_owners() -> None:
    """Alice queues 8 behind 2 slots; Bob's one request runs as soon as a slot frees, before the
    rest of her backlog (FIFO ran it last), and hers still run in her own order."""
    eng = await started(replace(FAST, max_seqs=2, synthetic_step_ms=2.0))
    try:
        params = SamplingParams()
        alice = [
            eng.generate(f"a{i}", user(f"[[synthetic:tokens={5 + i}]]"), params, owner="alice")
            for i in range(8)
        ]
        await asyncio.sleep(0.001)
        assert (eng.stats().running, eng.stats().waiting) == (2, 6)
        bob = eng.generate("b", user("[[synthetic:tokens=5]] hi"), params, owner="bob")
        results = await asyncio.gather(*(collect(s) for s in [*alice, bob]))
        starts = [fin.admitted_at for _, _, fin in results]
        bob_start = starts[-1]
        assert bob_start is not None
        assert (
            sum(1 for t in starts[:8] if t is not None and t < bob_start) == 2
        )  # only the first 2
        assert starts[:8] == sorted(starts[:8])  # type: ignore[type-var]
    finally:
        await eng.shutdown()


async def test_kv_cells_are_accounted_and_limit_admission() -> None:
    # each request reserves prompt + max_tokens cells; only one fits in 100 cells at a time
    eng = await started(replace(FAST, kv_cells=100, synthetic_step_ms=5.0))
    try:
        msg = user("[[synthetic:tokens=40]]")
        prompt_tokens = prompt_token_count(render_prompt(msg))
        params = SamplingParams(max_tokens=60)
        a = eng.generate("a", msg, params)
        b = eng.generate("b", msg, params)
        got_a = asyncio.create_task(collect(a))
        seen: list[int] = []
        while not got_a.done():
            stats = eng.stats()
            assert stats.running <= 1 and stats.kv_total == 100
            if stats.running and not a.finished:  # once a ends, b's cells start over
                seen.append(stats.kv_used)
            await asyncio.sleep(0.003)
        assert seen and min(seen) >= prompt_tokens and max(seen) <= prompt_tokens + 40
        assert seen == sorted(seen)  # grows by one cell per sampled token
        _, _, fin_b = await collect(b)
        assert fin_b.first_token_at >= (await got_a)[2].finished_at  # type: ignore[operator]
        assert eng.stats().kv_used == 0
    finally:
        await eng.shutdown()


async def test_prompt_larger_than_kv_cache_is_refused() -> None:
    eng = await started(replace(FAST, kv_cells=16))
    try:
        with pytest.raises(PromptTooLongError):
            eng.generate("r", user("x" * 200), SamplingParams())
    finally:
        await eng.shutdown()


async def test_abort_is_idempotent_and_ends_with_cancelled() -> None:
    eng = await started(replace(FAST, max_seqs=1, synthetic_step_ms=5.0))
    try:
        running = eng.generate("run", user("[[synthetic:tokens=1000]]"), SamplingParams())
        waiting = eng.generate("wait", user("[[synthetic:tokens=1000]]"), SamplingParams())
        first = await anext(running)
        assert isinstance(first, TextDelta)
        assert (eng.stats().running, eng.stats().waiting) == (1, 1)
        eng.abort("run")
        eng.abort("run")
        eng.abort("wait")
        eng.abort("never-existed")
        _, _, fin = await collect(running)
        _, deltas_w, fin_w = await collect(waiting)
        assert fin.reason is FinishReason.CANCELLED and fin.completion_tokens < 1000
        assert fin_w.reason is FinishReason.CANCELLED and deltas_w == []
        assert fin_w.first_token_at is None and fin_w.completion_tokens == 0
        await asyncio.sleep(0.02)
        stats = eng.stats()
        assert (stats.running, stats.waiting, stats.kv_used) == (0, 0, 0)
        eng.abort("run")  # after the end: still harmless
    finally:
        await eng.shutdown()


async def test_abort_from_another_thread(engine: SyntheticEngine) -> None:
    stream = engine.generate(
        "r", user("[[synthetic:tokens=1000]]"), SamplingParams(max_tokens=1000)
    )
    await anext(stream)
    await asyncio.to_thread(engine.abort, "r")
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED and fin.completion_tokens < 1000


async def test_closing_the_stream_aborts_the_request(engine: SyntheticEngine) -> None:
    stream = engine.generate(
        "r", user("[[synthetic:tokens=1000]]"), SamplingParams(max_tokens=1000)
    )
    await anext(stream)
    await stream.aclose()
    for _ in range(100):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.005)
    assert engine.stats().running == 0
    # the id is free again once the engine has dropped it
    await collect(engine.generate("r", user("[[synthetic:tokens=2]]"), SamplingParams()))


async def test_shutdown_cancels_everything() -> None:
    eng = await started(replace(FAST, max_seqs=1))
    streams = [
        eng.generate(f"r{i}", user("[[synthetic:tokens=10000]]"), SamplingParams(max_tokens=10000))
        for i in range(3)
    ]
    await anext(streams[0])
    await eng.shutdown()
    results = await asyncio.gather(*(collect(s) for s in streams))
    assert [fin.reason for _, _, fin in results] == [FinishReason.CANCELLED] * 3
    assert eng.stats().running == 0 and eng.stats().waiting == 0


async def test_step_time_grows_with_the_batch() -> None:
    settings = replace(
        FAST,
        max_seqs=64,
        synthetic_step_ms=2.0,
        synthetic_per_seq_ms=1.0,
        synthetic_prefill_ms_per_token=0.5,
    )
    eng = await started(settings)
    try:
        msg = user("[[synthetic:tokens=10]]")
        prompt_tokens = prompt_token_count(render_prompt(msg))
        t0 = time.perf_counter()
        await collect(eng.generate("solo", msg, SamplingParams()))
        solo = time.perf_counter() - t0
        assert eng.stats().extra["last_step_ms"] == pytest.approx(2.0 + 1.0)

        t0 = time.perf_counter()
        batch = [eng.generate(f"b{i}", msg, SamplingParams()) for i in range(40)]
        results = await asyncio.gather(*(collect(s) for s in batch))
        batched = time.perf_counter() - t0
        assert all(fin.completion_tokens == 10 for _, _, fin in results)
        # 10 steps of 2 + 40 * 1 ms, plus one prefill of 40 prompts: a lower bound sleep guarantees
        floor = (10 * (2.0 + 40 * 1.0) + 40 * prompt_tokens * 0.5) / 1000
        assert batched >= floor * 0.95
        assert batched > 5 * solo
        assert eng.stats().extra["last_step_ms"] == pytest.approx(2.0 + 40 * 1.0)
    finally:
        await eng.shutdown()


async def test_thousands_of_streams_are_cheap() -> None:
    settings = replace(
        FAST,
        max_seqs=3000,
        kv_cells=3000 * 64,
        synthetic_step_ms=5.0,
        synthetic_per_seq_ms=0.0,
    )
    eng = await started(settings)
    try:
        msg = user("[[synthetic:tokens=20]]")
        t0 = time.perf_counter()
        params = [SamplingParams(max_tokens=20, seed=i) for i in range(3000)]  # reserve little KV
        streams = [eng.generate(f"r{i}", msg, p) for i, p in enumerate(params)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        elapsed = time.perf_counter() - t0
        assert all(fin.completion_tokens == 20 for _, _, fin in results)
        assert eng.stats().tokens_generated == 3000 * 20
        assert eng.stats().steps < 40  # all 3000 sequences advance together
        assert elapsed < 30, f"3000 streams x 20 tokens took {elapsed:.1f}s"
    finally:
        await eng.shutdown()
