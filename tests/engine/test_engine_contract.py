"""The engine contract (app/engine/base.py), one suite for every engine.

Each test runs on llama.cpp with the real SmolLM2 model, on the synthetic engine, on the
TensorRT-LLM adapter over the FAKE `tensorrt_llm` (tests/fakes/tensorrt_llm/: TensorRT-LLM needs a
GPU; the fake reproduces TensorRT-LLM 1.x's behaviour from its sources), and on ENGINE=openai in
front of a real llama.cpp `llama-server` with SmolLM2 (tests/llama_server.py; 4 slots, so that
the fifth request waits in the app as `max_seqs=4` makes it wait in the others), and on
ENGINE=process: the client a web worker uses, against llama.cpp served by a real engine process
(`python -m app.engine.process`, tests/engine_process.py). What an engine does beyond the
contract is tested in its own module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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
from app.settings import EngineSettings
from tests.engine.streams import collect
from tests.engine.test_trtllm_fake import install_fake
from tests.engine_process import EngineProcess
from tests.fakes import tensorrt_llm as fake_trt
from tests.llama_server import LlamaServer

# ENGINE=openai needs llama-server compiled and running: the `live` tier, not `fast` (conftest.py).
# So does ENGINE=process (an engine process beside the tests).
ENGINES = [
    "llamacpp",
    "synthetic",
    "trtllm-fake",
    pytest.param("openai", marks=pytest.mark.live),
    pytest.param("process", marks=pytest.mark.live),
]
CONTEXT = 512
# Long for every engine: SmolLM2 goes on and on; the synthetic engine obeys the marker; the fake
# TensorRT-LLM (script None) counts words up to max_tokens.
LONG = [{"role": "user", "content": "Write a long story about a dragon. [[synthetic:tokens=4000]]"}]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The llama-server ENGINE=openai runs in front of, started on first use."""
    log = Path(tmp_path_factory.mktemp("upstream")) / "llama-server.log"
    with LlamaServer(log, parallel=4, slot_context=CONTEXT, threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def engine_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """llama.cpp with the settings below, served on a socket, started on first use."""
    folder = Path(tmp_path_factory.mktemp("engine-process"))
    env = {
        "ENGINE": "llamacpp",
        "ENGINE_CONTEXT": str(CONTEXT),
        "ENGINE_MAX_SEQS": "4",
        "ENGINE_KV_CELLS": "4096",
        "ENGINE_THREADS": "1",
    }
    with EngineProcess(folder / "engine.sock", env, folder / "engine.log") as process:
        yield process


def settings_for(
    kind: str, upstreams: tuple[str, ...] = (), socket_path: str | None = None
) -> EngineSettings:
    return EngineSettings(
        kind=kind,
        upstreams=upstreams,
        socket_path=socket_path,
        context_size=CONTEXT,
        max_seqs=4,
        kv_cells=4096,
        threads=1,
        synthetic_step_ms=2.0,
    )


@pytest.fixture(params=ENGINES)
async def engine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Engine]:
    kind = request.param
    if kind == "trtllm-fake":
        install_fake(monkeypatch)
        fake_trt.LLM.script = None  # endless: " w1 w2 ..." up to max_tokens
        kind = "trtllm"
    upstreams = ()
    socket_path = None
    if kind == "openai":
        upstreams = (request.getfixturevalue("upstream").openai_url,)
    if kind == "process":
        socket_path = str(request.getfixturevalue("engine_process").socket)
    eng = create_engine(settings_for(kind, upstreams, socket_path))
    await eng.start()
    yield eng
    await eng.shutdown()


async def wait_idle(engine: Engine) -> None:
    for _ in range(400):
        if engine.stats().running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still running: {engine.stats()}")


async def test_contract_a_reply_streams_and_ends_with_one_finished(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert engine.context_size <= CONTEXT and engine.model_name
    text, deltas, fin = await collect(engine.generate("r", LONG, GREEDY))
    assert text and len(deltas) >= 2
    assert all(d.text for d in deltas)
    assert fin.reason is FinishReason.LENGTH and fin.error is None  # max_tokens came first
    assert fin.completion_tokens == GREEDY.max_tokens
    assert sum(len(d.token_ids) for d in deltas) <= fin.completion_tokens
    assert fin.prompt_tokens > 0
    assert fin.first_token_at is not None
    assert fin.queued_at <= fin.first_token_at <= fin.finished_at
    await wait_idle(engine)
    assert engine.stats().tokens_generated >= GREEDY.max_tokens


async def test_contract_min_p_and_penalties_are_accepted_sampled_and_greedy(
    engine: Engine,
) -> None:
    tuned = {"min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repeat_penalty": 1.3}
    for rid, temperature in (("sampled", 0.8), ("greedy", 0.0)):
        params = SamplingParams(max_tokens=12, temperature=temperature, seed=5, **tuned)
        text, _, fin = await collect(engine.generate(rid, LONG, params))
        assert text and fin.reason is FinishReason.LENGTH and fin.completion_tokens == 12


async def test_contract_stop_string_ends_the_reply_before_it(engine: Engine) -> None:
    text, _, _ = await collect(engine.generate("a", LONG, GREEDY))
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    params = SamplingParams(max_tokens=GREEDY.max_tokens, temperature=0.0, seed=1, stop=(stop,))
    cut, _, fin = await collect(engine.generate("b", LONG, params))
    assert fin.reason is FinishReason.STOP
    assert cut == text[: text.index(stop)]


async def test_contract_abort_ends_with_cancelled_and_frees_the_request(engine: Engine) -> None:
    params = SamplingParams(max_tokens=400, temperature=0.0)
    stream = engine.generate("r", LONG, params)
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    assert engine.stats().running == 1
    engine.abort("r")
    engine.abort("r")  # idempotent
    engine.abort("no-such-request")
    _, deltas, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    # Every token the engine delivered is counted, and the abort cut the reply short.
    delivered = len(first.token_ids) + sum(len(d.token_ids) for d in deltas)
    assert delivered <= fin.completion_tokens < params.max_tokens
    await wait_idle(engine)
    engine.abort("r")  # after the end: harmless


async def test_contract_abort_from_another_thread(engine: Engine) -> None:
    stream = engine.generate("r", LONG, SamplingParams(max_tokens=400, temperature=0.0))
    await anext(stream)
    await asyncio.to_thread(engine.abort, "r")
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    await wait_idle(engine)


async def test_contract_closing_the_stream_aborts(engine: Engine) -> None:
    stream = engine.generate("r", LONG, SamplingParams(max_tokens=400, temperature=0.0))
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    await wait_idle(engine)


async def test_contract_stop_of_a_request_that_waits_for_a_slot(engine: Engine) -> None:
    """More requests than max_seqs: Stop on one still waiting ends it `cancelled`, no tokens."""
    params = SamplingParams(max_tokens=400, temperature=0.0)
    running = [engine.generate(f"r{i}", LONG, params) for i in range(4)]
    waiting = engine.generate("waiting", LONG, params)
    for stream in running:
        await anext(stream)
    engine.abort("waiting")
    _, deltas, fin = await asyncio.wait_for(collect(waiting), timeout=30)
    assert (deltas, fin.reason, fin.completion_tokens) == ([], FinishReason.CANCELLED, 0)
    for i in range(4):
        engine.abort(f"r{i}")
    for stream in running:
        assert (await collect(stream))[2].reason is FinishReason.CANCELLED
    await wait_idle(engine)


async def test_contract_bad_input_is_refused_before_anything_runs(engine: Engine) -> None:
    with pytest.raises(PromptTooLongError):
        engine.generate("long", [{"role": "user", "content": "word " * 4000}], GREEDY)
    with pytest.raises(EngineError):  # PromptTooLongError is one; so is every refusal
        engine.generate("long", [{"role": "user", "content": "word " * 4000}], GREEDY)
    stream = engine.generate("dup", LONG, GREEDY)
    with pytest.raises(DuplicateRequestError):
        engine.generate("dup", LONG, GREEDY)
    await collect(stream)
    assert engine.stats().running == 0


async def test_contract_requests_of_several_owners(engine: Engine) -> None:
    """`owner` (keyword-only) names whom a request is for; every engine accepts it."""
    results = await asyncio.gather(
        *(collect(engine.generate(f"r{i}", LONG, GREEDY, owner=f"user-{i % 2}")) for i in range(3)),
        collect(engine.generate("anonymous", LONG, GREEDY, owner=None)),
    )
    assert [fin.reason for _, _, fin in results] == [FinishReason.LENGTH] * 4


async def test_contract_shutdown_cancels_open_streams_and_refuses_new_ones(engine: Engine) -> None:
    params = SamplingParams(max_tokens=400, temperature=0.0)
    streams = [engine.generate(f"r{i}", LONG, params) for i in range(6)]  # 2 wait for a slot
    await anext(streams[0])
    await engine.shutdown()
    results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), timeout=30)
    assert [fin.reason for _, _, fin in results] == [FinishReason.CANCELLED] * 6
    assert engine.stats().running == 0
    with pytest.raises(EngineUnavailableError):
        engine.generate("late", LONG, GREEDY)


CHAT = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Name three colours. [[synthetic:tokens=3]]"},
    {"role": "assistant", "content": "Red, green and blue — «ok» 🌈."},
    {"role": "user", "content": "And three animals, in Hebrew: שלום [[synthetic:tokens=3]]"},
]


async def test_contract_message_counts_bound_the_prompt(engine: Engine) -> None:
    """`count_tokens` per message plus `prompt_overhead` is what the page fits a history with:
    never below the prompt the engine really builds, and (with a tokenizer) close to it."""
    counted = sum(engine.count_tokens(m) for m in CHAT) + engine.prompt_overhead
    *_, fin = await collect(engine.generate("c", CHAT, SamplingParams(max_tokens=3, seed=1)))
    assert counted >= fin.prompt_tokens > 0
    assert counted - fin.prompt_tokens <= 96  # openai's estimate; the others within a few
