"""The TensorRT-LLM adapter against a FAKE `tensorrt_llm` (tests/fakes/tensorrt_llm/).

TensorRT-LLM cannot run here (no GPU), so these tests check the adapter against the behaviour of
TensorRT-LLM 1.x that the fake reproduces from its sources (each cited in the fake); they say
nothing about TensorRT-LLM itself. The real thing is exercised by bench/gpu_smoke.py on a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from app.engine import create_engine
from app.engine.base import (
    DuplicateRequestError,
    Engine,
    EngineError,
    EngineEvent,
    EngineUnavailableError,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.streams import EventStream
from app.engine.trtllm.engine import TrtLlmEngine
from app.engine.trtllm.setup import SINGLE_PROCESS_ENV, TrtLlmUnavailableError
from app.settings import EngineSettings
from tests.engine.streams import collect
from tests.fakes import tensorrt_llm as fake
from tests.fakes.tensorrt_llm import executor as fake_executor
from tests.fakes.tensorrt_llm import llmapi as fake_llmapi
from tests.fakes.tensorrt_llm.executor import utils as fake_executor_utils
from tests.fakes.tensorrt_llm.llmapi import utils as fake_llmapi_utils

SETTINGS = EngineSettings(kind="trtllm", context_size=512, max_seqs=8)
USER = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[fake.LLM]]:
    """Install the fake as `tensorrt_llm`; the env var the engine sets is restored afterwards."""
    install_fake(monkeypatch)
    yield fake.LLM
    fake.LLM.reset()


def install_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import tensorrt_llm` (and its submodules the adapter uses) finds the fake, as in a fresh
    process: nothing built yet, the worker-process variable unset and not yet read."""
    fake.LLM.reset()
    monkeypatch.setattr(fake, "__version__", "1.0.0+fake")
    fake_llmapi.TorchLlmArgs.model_fields = dict.fromkeys(fake_llmapi.V1_0_FIELDS)
    fake_llmapi_utils.enable_worker_single_process_for_tp1.cache_clear()
    for name, module in {
        "tensorrt_llm": fake,
        "tensorrt_llm.executor": fake_executor,
        "tensorrt_llm.executor.utils": fake_executor_utils,
        "tensorrt_llm.llmapi": fake_llmapi,
        "tensorrt_llm.llmapi.utils": fake_llmapi_utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "placeholder")
    monkeypatch.delenv(SINGLE_PROCESS_ENV)


@pytest.fixture
async def engine(fake_trt: type[fake.LLM]) -> AsyncIterator[TrtLlmEngine]:
    eng = TrtLlmEngine(SETTINGS)
    await eng.start()
    yield eng
    await eng.shutdown()


def the_llm() -> fake.LLM:
    assert len(fake.LLM.instances) == 1
    return fake.LLM.instances[0]


async def test_trtllm_adapter_against_fake_streams_text(engine: TrtLlmEngine) -> None:
    assert isinstance(engine, Engine)
    text, deltas, fin = await collect(engine.generate("r", USER, SamplingParams()))
    assert text == "Hello, world!"
    assert [d.text for d in deltas] == ["Hello", ",", " wor", "ld", "!"]  # streamed, not batched
    assert [len(d.token_ids) for d in deltas] == [1] * 5
    assert fin.reason is FinishReason.STOP and fin.error is None
    assert fin.completion_tokens == 5
    assert fin.queued_at <= fin.first_token_at <= fin.finished_at  # type: ignore[operator]
    # the prompt is the model's chat template, tokenised once without a second BOS, passed as ids
    llm = the_llm()
    rendered = llm.tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)  # type: ignore[union-attr]
    ids = llm.tokenizer.encode(rendered, add_special_tokens=False)  # type: ignore[union-attr]
    assert llm.inputs == [ids]
    assert fin.prompt_tokens == len(ids)
    assert engine.stats().tokens_generated == 5
    assert engine.stats().extra["trt_finish_stop"] == 1.0


async def test_trtllm_adapter_against_fake_holds_token_ids_until_text_shows(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = [
        "caf",
        "",
        "é 👋",
        "",
        "",
        "🏽",
    ]  # empty: a token whose character is incomplete
    text, deltas, fin = await collect(engine.generate("r", USER, SamplingParams()))
    assert text == "café 👋🏽"
    assert [len(d.token_ids) for d in deltas] == [1, 2, 3]
    assert fin.completion_tokens == 6


@pytest.mark.parametrize(
    ("end_with", "max_tokens", "reason"),
    [
        (None, 100, FinishReason.STOP),  # end-of-sequence: "stop"
        (None, 3, FinishReason.LENGTH),  # max_tokens: "length"
        ("cancelled", 100, FinishReason.CANCELLED),  # the runtime cancelled it on its own
        ("timeout", 100, FinishReason.ERROR),  # no such reason here: an error that says so
    ],
)
async def test_trtllm_adapter_against_fake_maps_finish_reasons(
    engine: TrtLlmEngine,
    fake_trt: type[fake.LLM],
    end_with: str | None,
    max_tokens: int,
    reason: FinishReason,
) -> None:
    fake_trt.end_with = end_with
    text, _, fin = await collect(engine.generate("r", USER, SamplingParams(max_tokens=max_tokens)))
    assert fin.reason is reason
    if reason is FinishReason.ERROR:
        assert fin.error and "timed out" in fin.error
    if reason is FinishReason.LENGTH:
        assert (text, fin.completion_tokens) == ("Hello, wor", 3)


async def test_trtllm_adapter_against_fake_always_sets_max_tokens(engine: TrtLlmEngine) -> None:
    await collect(engine.generate("a", USER, SamplingParams()))  # our default: 256, not TRT's 32
    await collect(engine.generate("b", USER, SamplingParams(max_tokens=7)))
    await collect(engine.generate("c", USER, SamplingParams(max_tokens=100_000)))
    sent = [r.sampling_params for r in the_llm().requests]
    prompt = len(the_llm().inputs[2])
    assert [p.max_tokens for p in sent] == [256, 7, SETTINGS.context_size - prompt]


async def test_trtllm_adapter_against_fake_maps_sampling_params(engine: TrtLlmEngine) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.8, top_k=40, seed=11, stop=("zz",))
    await collect(engine.generate("a", USER, params))
    await collect(engine.generate("b", USER, SamplingParams(temperature=0.0, seed=3)))
    await collect(engine.generate("c", USER, SamplingParams(top_k=0)))
    sampled, greedy, no_top_k = (r.sampling_params for r in the_llm().requests)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.seed) == (0.9, 0.8, 40, 11)
    assert sampled.stop is None  # our detokenizer handles stop strings, not TensorRT-LLM
    assert (greedy.top_k, greedy.temperature, greedy.seed) == (1, None, 3)
    assert no_top_k.top_k is None
    # unseeded: a fresh seed each (the TRTLLM sampler would seed 0 and repeat itself, #1000)
    assert isinstance(no_top_k.seed, int)
    assert no_top_k.seed != the_llm().requests[0].sampling_params.seed


async def test_trtllm_adapter_against_fake_maps_min_p_and_penalties(engine: TrtLlmEngine) -> None:
    """TensorRT-LLM's own field names (tensorrt_llm/sampling_params.py); neutral values unset."""
    tuned = SamplingParams(
        temperature=0.9,
        min_p=0.05,
        repeat_penalty=1.1,
        frequency_penalty=0.4,
        presence_penalty=-0.5,
    )
    await collect(engine.generate("a", USER, tuned))
    await collect(engine.generate("b", USER, SamplingParams(temperature=0.0, min_p=0.3)))
    await collect(engine.generate("c", USER, SamplingParams()))
    sampled, greedy, plain = (r.sampling_params for r in the_llm().requests)
    assert (sampled.min_p, sampled.repetition_penalty) == (0.05, 1.1)
    assert (sampled.frequency_penalty, sampled.presence_penalty) == (0.4, -0.5)
    assert greedy.min_p is None  # nothing to cut when only the top token is taken
    assert (plain.min_p, plain.repetition_penalty, plain.frequency_penalty) == (None, None, None)
    assert plain.presence_penalty is None


async def a_long_reply_under_way(engine: TrtLlmEngine, fake_trt: type[fake.LLM]) -> EventStream:
    """Request "r", a 10,000-token reply, and read its first delta."""
    fake_trt.script = ["tok "] * 10_000
    stream = engine.generate("r", USER, SamplingParams(max_tokens=10_000))
    assert isinstance(await anext(stream), TextDelta)
    return stream


async def test_trtllm_adapter_against_fake_abort_cancels_via_request_output_abort(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    """What the contract suite checks of an abort (test_engine_contract.py), here: how it
    reaches TensorRT-LLM."""
    stream = await a_long_reply_under_way(engine, fake_trt)
    engine.abort("r")
    engine.abort("r")  # idempotent: one RequestOutput.abort()
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    request = the_llm().requests[0]
    assert request.abort_calls == 1
    assert request.outputs[0].finish_reason == "cancelled"  # the runtime confirmed it
    assert engine.stats().running == 0
    assert engine.stats().extra["trt_finish_cancelled"] == 1.0
    engine.abort("r")  # after the end: harmless


async def test_trtllm_adapter_against_fake_abort_from_another_thread(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    stream = await a_long_reply_under_way(engine, fake_trt)
    await asyncio.to_thread(engine.abort, "r")
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    assert the_llm().requests[0].abort_calls == 1


async def test_trtllm_adapter_against_fake_closing_the_stream_aborts(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    stream = await a_long_reply_under_way(engine, fake_trt)
    await stream.aclose()
    for _ in range(200):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.005)
    assert engine.stats().running == 0
    assert the_llm().requests[0].abort_calls == 1


async def test_trtllm_adapter_against_fake_stop_string_holdback(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = ["Hi", " there", "\n\nUs", "er", ": more", " never shown"] + ["x"] * 1000
    params = SamplingParams(max_tokens=2000, stop=("\n\nUser:",))
    text, deltas, fin = await collect(engine.generate("r", USER, params))
    assert text == "Hi there"
    assert all("\n" not in d.text for d in deltas)  # the stop prefix was never sent
    assert fin.reason is FinishReason.STOP
    assert fin.completion_tokens == 5
    request = the_llm().requests[0]
    assert request.abort_calls == 1  # the TensorRT-LLM request was ended too
    for _ in range(200):
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.005)
    assert engine.stats().running == 0


async def test_trtllm_adapter_against_fake_flushes_held_text_at_the_end(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = ["ends with", " \n\nUs"]  # a stop-string prefix that never completes
    text, _, fin = await collect(engine.generate("r", USER, SamplingParams(stop=("\n\nUser:",))))
    assert (text, fin.reason) == ("ends with \n\nUs", FinishReason.STOP)


async def test_trtllm_adapter_against_fake_runtime_failure_is_an_error(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.fail_after = 2
    text, _, fin = await collect(engine.generate("r", USER, SamplingParams()))
    assert text == "Hello,"
    assert fin.reason is FinishReason.ERROR
    assert fin.error and "fake executor died" in fin.error
    assert engine.stats().running == 0


@pytest.mark.parametrize("in_process", [True, False])
async def test_trtllm_adapter_against_fake_sets_worker_env_before_building(
    fake_trt: type[fake.LLM], in_process: bool
) -> None:
    eng = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=in_process))
    await eng.start()
    try:
        llm = the_llm()
        assert llm.in_process is in_process
        assert eng.stats().extra["trt_in_process"] == float(in_process)
        assert llm.built_on_thread is not threading.main_thread()  # the slow build is off-loop
        assert llm.kwargs["max_seq_len"] == SETTINGS.context_size
        assert llm.kwargs["max_batch_size"] == SETTINGS.max_seqs
        assert llm.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert eng.model_name == "SmolLM2-135M-Instruct"
    finally:
        await eng.shutdown()


def test_trtllm_worker_process_is_the_default() -> None:
    """TensorRT-LLM warns that its single-process worker "may hurt streaming generation
    performance" (executor/executor.py): the worker process is the default."""
    assert EngineSettings().trtllm_in_process is False


async def test_trtllm_adapter_against_fake_worker_mode_is_read_once_per_process(
    fake_trt: type[fake.LLM], caplog: pytest.LogCaptureFixture
) -> None:
    """llmapi/utils.py caches TLLM_WORKER_USE_SINGLE_PROCESS: a second engine in the same process
    asking for the other mode does not get it, and must say so rather than pretend."""
    first = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=True))
    await first.start()
    await first.shutdown()
    second = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=False))
    with caplog.at_level(logging.WARNING, logger="app.engine.trtllm.setup"):
        await second.start()
    try:
        assert fake.LLM.instances[1].in_process is True  # what TensorRT-LLM really does
        assert second.stats().extra["trt_in_process"] == 1.0  # what we report
        assert "has no effect" in caplog.text
    finally:
        await second.shutdown()


@pytest.mark.parametrize("version", ["0.21.0", "0.20.0rc3"])
async def test_trtllm_adapter_against_fake_refuses_versions_before_1_0(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Before 1.0, `tensorrt_llm.LLM` is the TensorRT-engine backend: refused with a clear error
    instead of being built (the old adapter retried without unknown arguments and hid it)."""
    monkeypatch.setattr(fake, "__version__", version)
    eng = TrtLlmEngine(SETTINGS)
    with pytest.raises(TrtLlmUnavailableError, match=r"1\.0 or newer"):
        await eng.start()
    assert fake_trt.instances == []


async def test_trtllm_adapter_against_fake_logs_version_backend_and_sampler(
    fake_trt: type[fake.LLM], caplog: pytest.LogCaptureFixture
) -> None:
    eng = TrtLlmEngine(SETTINGS)
    with caplog.at_level(logging.INFO, logger="app.engine.trtllm.engine"):
        await eng.start()
    try:
        assert "1.0.0+fake: pytorch backend, TRTLLMSampler" in caplog.text
        assert "worker process" in caplog.text
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_reports_queue_and_kv_from_iteration_stats(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More requests than max_batch_size: iteration stats show the queue and the KV blocks in use
    while they run, and, polled on after the last one ends, an empty queue and cache: stats do
    not go stale between submissions (the old adapter stopped polling when idle and kept the
    last figures it had read)."""
    monkeypatch.setattr("app.engine.trtllm.stats.STATS_POLL_S", 0.01)
    engine = TrtLlmEngine(SETTINGS)
    await engine.start()
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_used, stats.kv_total) == (0, 0, 0, 0)
    fake_trt.script = ["tok "] * 150
    streams = [engine.generate(f"r{i}", USER, SamplingParams(max_tokens=150)) for i in range(12)]
    peak_waiting = peak_kv = 0
    collecting = asyncio.gather(*(collect(s) for s in streams))
    while not collecting.done():
        peak_waiting = max(peak_waiting, engine.stats().waiting)
        peak_kv = max(peak_kv, engine.stats().kv_used)
        await asyncio.sleep(0.005)
    await collecting
    assert peak_waiting == 12 - SETTINGS.max_seqs  # 4 waited for a slot
    assert peak_kv > 0
    for _ in range(200):
        if engine.stats().steps >= 2 * 150:  # the last iterations' stats have been read
            break
        await asyncio.sleep(0.01)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_used) == (0, 0, 0)
    assert stats.kv_total == fake.MAX_BLOCKS * fake.TOKENS_PER_BLOCK
    assert stats.steps >= 2 * 150  # two rounds of the batch
    assert stats.extra["trt_active_requests"] == 0
    await engine.shutdown()


async def test_trtllm_adapter_against_fake_refuses_bad_input_eagerly(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    with pytest.raises(PromptTooLongError) as info:
        engine.generate("long", [{"role": "user", "content": "x" * 600}], SamplingParams())
    assert info.value.context_size == SETTINGS.context_size
    with pytest.raises(EngineError):
        engine.generate("bad", [{"role": "robot", "content": "hi"}], SamplingParams())
    with pytest.raises(EngineError):
        engine.generate("none", [], SamplingParams())
    fake_trt.script = ["tok "] * 10_000
    stream = engine.generate("dup", USER, SamplingParams(max_tokens=10_000))
    with pytest.raises(DuplicateRequestError):
        engine.generate("dup", USER, SamplingParams())
    engine.abort("dup")
    await collect(stream)
    assert len(the_llm().requests) == 1  # nothing refused ever reached the runtime


async def test_trtllm_adapter_against_fake_not_started_and_shutdown(
    fake_trt: type[fake.LLM],
) -> None:
    eng = TrtLlmEngine(SETTINGS)
    with pytest.raises(EngineUnavailableError):
        eng.generate("r", USER, SamplingParams())
    assert fake_trt.instances == []  # nothing is built before start()
    await eng.start()
    fake_trt.script = ["tok "] * 10_000
    streams = [eng.generate(f"r{i}", USER, SamplingParams(max_tokens=10_000)) for i in range(3)]
    await anext(streams[0])
    await eng.shutdown()
    results = await asyncio.gather(*(collect(s) for s in streams))
    assert [fin.reason for _, _, fin in results] == [FinishReason.CANCELLED] * 3
    assert the_llm()._executor.is_shutdown()
    assert eng.stats().running == 0
    with pytest.raises(EngineUnavailableError):
        eng.generate("late", USER, SamplingParams())


def test_trtllm_adapter_without_tensorrt_llm_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No fake installed: `tensorrt_llm` cannot be imported (None in sys.modules blocks it)."""
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    for build in (lambda: TrtLlmEngine(SETTINGS), lambda: create_engine(SETTINGS)):
        with pytest.raises(EngineUnavailableError) as info:
            build()
        assert isinstance(info.value, TrtLlmUnavailableError)
        message = str(info.value)
        assert "TensorRT-LLM is not installed" in message
        assert ".[gpu]" in message and "pypi.nvidia.com" in message


async def test_trtllm_adapter_import_failure_at_start_is_clear(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = TrtLlmEngine(SETTINGS)  # looked installed when selected ...
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # ... but is gone when it starts
    with pytest.raises(TrtLlmUnavailableError, match=r"pypi\.nvidia\.com"):
        await eng.start()


# -- TensorRT-LLM 1.x as its sources show it behaves (each fails against the adapter before #8) --


async def run_until_tokens(stream: AsyncIterator[EngineEvent], count: int) -> list[TextDelta]:
    deltas: list[TextDelta] = []
    while sum(len(d.token_ids) for d in deltas) < count:
        event = await anext(stream)
        assert isinstance(event, TextDelta), event
        deltas.append(event)
    return deltas


def as_release(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """The fake as TensorRT-LLM `version`: its `__version__` and `TorchLlmArgs` fields."""
    monkeypatch.setattr(fake, "__version__", version)
    fake_llmapi.TorchLlmArgs.model_fields = dict.fromkeys(fake_llmapi.release_fields(version))


async def tokens_of(eng: TrtLlmEngine, rid: str, params: SamplingParams) -> list[int]:
    _, deltas, _ = await collect(eng.generate(rid, USER, params))
    return [t for d in deltas for t in d.token_ids]


@pytest.mark.parametrize(
    ("version", "expected_kwargs", "sampler", "ignored"),
    [
        ("1.0.0", {"enable_trtllm_sampler": True}, "TRTLLMSampler", set()),
        ("1.1.0", {"sampler_type": "TRTLLMSampler"}, "TRTLLMSampler", set()),
        ("1.2.1", {"sampler_type": "TRTLLMSampler"}, "TRTLLMSampler", set()),
        ("1.3.0", {"sampler_type": "TorchSampler"}, "TorchSampler", {"seed"}),
        ("1.4.0rc4", {"sampler_type": "TorchSampler"}, "TorchSampler", {"seed"}),
    ],
)
async def test_trtllm_adapter_against_fake_chooses_the_sampler_per_release(
    fake_trt: type[fake.LLM],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    version: str,
    expected_kwargs: dict[str, object],
    sampler: str,
    ignored: set[str],
) -> None:
    """Issue 23 items 1-2: the TRTLLM sampler below 1.3 (it applies every field; 1.1/1.2's
    TorchSampler drops the penalties and the seed), TorchSampler from 1.3; what the release
    ignores is logged; two unseeded sampled replies differ (the TRTLLM sampler seeds 0)."""
    as_release(monkeypatch, version)
    eng = TrtLlmEngine(SETTINGS)
    with caplog.at_level(logging.INFO, logger="app.engine.trtllm.engine"):
        await eng.start()
    try:
        llm = the_llm()
        assert {k: llm.kwargs[k] for k in expected_kwargs} == expected_kwargs
        assert llm.sampler == eng.sampler == sampler
        warm = SamplingParams(temperature=0.8, repeat_penalty=1.2)
        first = await tokens_of(eng, "a", warm)
        second = await tokens_of(eng, "b", warm)
        assert first != second  # unseeded: two replies differ
        assert all(r.sampled for r in llm.requests)
        assert "repetition_penalty" in llm.requests[0].honoured  # the app's repeat penalty
        assert llm.requests[0].ignored == ignored & {"seed"}
        seeded = [await tokens_of(eng, f"s{i}", replace(warm, seed=5)) for i in range(2)]
        if not ignored:
            assert seeded[0] == seeded[1]  # one seed, one reply
        for field in ignored:
            assert f"ignores `{field}`" in caplog.text
        await collect(eng.generate("g", USER, SamplingParams(temperature=0)))
        assert not llm.requests[-1].sampled  # greedy stays greedy
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_refuses_to_start_without_readable_arguments(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 2: no TorchLlmArgs fields, no sampler choice: refuse to start rather than
    leave 1.0 on TorchSampler's greedy fast path for everyone."""
    monkeypatch.setattr(fake_llmapi.TorchLlmArgs, "model_fields", {})
    eng = TrtLlmEngine(SETTINGS)
    with pytest.raises(EngineUnavailableError, match="refusing to start"):
        await eng.start()
    assert fake_trt.instances == []


@pytest.mark.parametrize("salt", [True, False])
async def test_trtllm_adapter_against_fake_keeps_owners_prefix_caches_apart(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch, salt: bool
) -> None:
    """Issue 23 item 3: with `cache_salt` each owner reuses only their own prefix; a release
    without it gets block reuse turned off (no owner is faster for another's prompt)."""
    if not salt:
        monkeypatch.setattr(fake.LLM, "generate_async", fake.LLM.generate_async_before_cache_salt)
    eng = TrtLlmEngine(SETTINGS)
    await eng.start()
    try:
        long_prompt = [{"role": "user", "content": "a long shared prompt " * 10}]
        for rid, owner in (("a1", "alice"), ("b1", "bob"), ("a2", "alice")):
            await collect(eng.generate(rid, long_prompt, SamplingParams(), owner=owner))
        llm = the_llm()
        reused = [r.reused_blocks for r in llm.requests]
        if salt:
            assert [r.cache_salt for r in llm.requests] == ["alice", "bob", "alice"]
            assert reused[0] == reused[1] == 0 and reused[2] > 0  # alice's own prefix only
        else:
            assert llm.args.kv_cache_config.enable_block_reuse is False
            assert reused == [0, 0, 0]
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_stop_of_a_queued_request_ends_it_at_once(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request still in TensorRT-LLM's waiting queue is dropped on cancel with no response at
    all (py_executor.py `_handle_canceled_requests`), and one waiting in our fair queue was never
    handed over: Stop must end either `cancelled` at once, with no tokens (ABORT_GRACE_S, made an
    hour here so that waiting for a response shows as a hang)."""
    monkeypatch.setattr("app.engine.trtllm.engine.ABORT_GRACE_S", 3600.0)
    fake_trt.script = ["tok "] * 100_000
    running = [
        engine.generate(f"r{i}", USER, SamplingParams(max_tokens=100_000))
        for i in range(SETTINGS.max_seqs)
    ]
    queued = engine.generate("queued", USER, SamplingParams(max_tokens=100_000))
    for stream in running:
        await run_until_tokens(stream, 1)
    assert len(the_llm().requests) == SETTINGS.max_seqs  # held here: max_batch_size in there
    assert (engine.stats().running, engine.stats().waiting) == (SETTINGS.max_seqs, 1)
    engine.abort("queued")
    _, deltas, fin = await asyncio.wait_for(collect(queued), timeout=30)
    assert (deltas, fin.reason, fin.completion_tokens) == ([], FinishReason.CANCELLED, 0)
    assert fin.first_token_at is None
    assert (engine.stats().running, engine.stats().waiting) == (SETTINGS.max_seqs, 0)
    # one in TensorRT-LLM's own queue (it was handed over, the executor never scheduled it)
    the_llm().args.max_batch_size = SETTINGS.max_seqs - 1
    engine.abort("r0")
    await collect(running[0])
    late = engine.generate("late", USER, SamplingParams(max_tokens=100_000))
    for _ in range(200):
        if len(the_llm().requests) == SETTINGS.max_seqs + 1:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    assert len(the_llm().waiting) == 1  # really queued in TensorRT-LLM
    engine.abort("late")
    _, deltas, fin = await asyncio.wait_for(collect(late), timeout=30)
    assert (deltas, fin.reason, fin.completion_tokens) == ([], FinishReason.CANCELLED, 0)
    assert the_llm().requests[-1].abort_calls == 1
    assert not the_llm().waiting
    for stream in running[1:]:  # the running ones are untouched, and still stream
        await run_until_tokens(stream, 5)
    for i in range(1, SETTINGS.max_seqs):
        engine.abort(f"r{i}")
    results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in running[1:])), 30)
    assert {fin.reason for _, _, fin in results} == {FinishReason.CANCELLED}
    assert engine.stats().running == 0


async def test_trtllm_adapter_against_fake_shutdown_with_queued_requests_does_not_hang(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown with replies in flight, some never scheduled: all end `cancelled` without
    waiting out the abort grace for responses that the queued ones will never get."""
    monkeypatch.setattr("app.engine.trtllm.engine.ABORT_GRACE_S", 3600.0)
    eng = TrtLlmEngine(SETTINGS)
    await eng.start()
    fake_trt.script = ["tok "] * 100_000
    streams = [eng.generate(f"r{i}", USER, SamplingParams(max_tokens=100_000)) for i in range(11)]
    await run_until_tokens(streams[0], 3)
    await asyncio.wait_for(eng.shutdown(), timeout=30)
    results = await asyncio.gather(*(collect(s) for s in streams))
    assert [fin.reason for _, _, fin in results] == [FinishReason.CANCELLED] * 11
    assert [fin.completion_tokens for _, _, fin in results][SETTINGS.max_seqs :] == [0] * 3
    assert eng.stats().running == 0


@pytest.mark.parametrize("in_process", [True, False])
async def test_trtllm_adapter_against_fake_request_errors_are_refusals(
    fake_trt: type[fake.LLM], in_process: bool
) -> None:
    """What the worker refuses for one request is `RequestError` (executor/utils.py, base_worker.py
    `_enqueue_request`): in-process it is raised on the spot, a 400 (EngineError), not "engine
    unavailable"; with a worker process (issue 23 item 5) it arrives as an ErrorResponse on the
    stream, which ends `error` before any token, saying why. The engine keeps serving."""
    eng = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=in_process))
    await eng.start()
    try:
        fake_trt.reject_next = "Failed to load LoRA adapter: no such adapter"
        if in_process:
            with pytest.raises(EngineError) as info:
                eng.generate("r", USER, SamplingParams())
            assert not isinstance(info.value, EngineUnavailableError)
            assert "Failed to load LoRA adapter" in str(info.value)
        else:
            text, deltas, fin = await collect(eng.generate("r", USER, SamplingParams()))
            assert (text, deltas, fin.reason) == ("", [], FinishReason.ERROR)
            assert fin.error and "refused" in fin.error and "LoRA adapter" in fin.error
            assert eng.stats().extra["trt_finish_refused"] == 1.0
        text, _, fin = await collect(eng.generate("r2", USER, SamplingParams()))
        assert (text, fin.reason) == ("Hello, world!", FinishReason.STOP)
    finally:
        await eng.shutdown()


@pytest.mark.parametrize("in_process", [True, False])
async def test_trtllm_adapter_against_fake_checks_prompts_against_the_executors_limit(
    fake_trt: type[fake.LLM], in_process: bool
) -> None:
    """The model engine may lower max_seq_len (base_worker.py). In-process the adapter reads the
    executor's limit and refuses a prompt over it itself (a 400 quoting it). With a worker process,
    whose limit this process cannot see, the worker's refusal comes on the stream before any
    token (issue 23 item 5): the reply ends `error` quoting the real limit, which the adapter
    learns, so the next such prompt is a 400 quoting it."""
    fake_trt.executor_max_seq_len = 100
    eng = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=in_process))
    await eng.start()
    try:
        long_prompt = [{"role": "user", "content": "x" * 150}]
        if not in_process:
            _, _, fin = await collect(eng.generate("first", long_prompt, SamplingParams()))
            assert fin.reason is FinishReason.ERROR and fin.first_token_at is None
            assert fin.error and "context holds 100" in fin.error
        with pytest.raises(PromptTooLongError) as info:
            eng.generate("long", long_prompt, SamplingParams())
        assert not isinstance(info.value, EngineUnavailableError)
        assert eng.context_size == info.value.context_size == 100
        assert len(the_llm().requests) == (0 if in_process else 1)  # refused before it
        _, _, fin = await collect(eng.generate("ok", USER, SamplingParams()))
        assert fin.reason is FinishReason.STOP
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_reads_the_models_positions(
    fake_trt: type[fake.LLM],
) -> None:
    """Issue 23 item 5: ENGINE_CONTEXT above the model config's positions: the worker enforces
    the positions, which the adapter reads at start (the worker process's own limit is not
    visible here), so a prompt over them is a 400 quoting the real limit."""
    fake_trt.model_positions = 300
    eng = TrtLlmEngine(SETTINGS)  # 512 asked, worker process
    await eng.start()
    try:
        assert eng.context_size == 300
        with pytest.raises(PromptTooLongError, match="holds 300"):
            eng.generate("long", [{"role": "user", "content": "x" * 350}], SamplingParams())
        assert the_llm().requests == []
    finally:
        await eng.shutdown()


async def test_trtllm_default_context_is_the_models_and_messages_are_counted(
    fake_trt: type[fake.LLM],
) -> None:
    """ENGINE_CONTEXT 0 (the default): no max_seq_len asked; TensorRT-LLM takes the model
    config's positions, and the adapter reads them back. `count_tokens` is the message's share of
    the ChatML prompt (the fake's tokenizer: a token per character)."""
    fake_trt.model_positions = 4096
    eng = TrtLlmEngine(replace(SETTINGS, context_size=0))
    await eng.start()
    try:
        assert "max_seq_len" not in the_llm().kwargs
        assert eng.context_size == 4096
        message = {"role": "user", "content": "hello"}
        assert eng.count_tokens(message) == len("<|im_start|>user\nhello<|im_end|>\n")
        assert eng.prompt_overhead == len("<|im_start|>assistant\n")
    finally:
        await eng.shutdown()


@pytest.mark.parametrize("chunked_prefill_field", [True, False])
async def test_trtllm_adapter_against_fake_prompts_over_max_num_tokens(
    fake_trt: type[fake.LLM], chunked_prefill_field: bool
) -> None:
    """Issue 23 item 6: ENGINE_CONTEXT above max_num_tokens (8192 by default): chunked prefill is
    asked for, so such prompts are served; where it cannot be, they are refused before
    submitting, quoting max_num_tokens rather than the context."""
    if not chunked_prefill_field:
        fields = set(fake_llmapi.TorchLlmArgs.model_fields) - {"enable_chunked_prefill"}
        fake_llmapi.TorchLlmArgs.model_fields = dict.fromkeys(fields)
    fake_trt.model_positions = 32768
    eng = TrtLlmEngine(replace(SETTINGS, context_size=16384))
    await eng.start()
    try:
        prompt = [{"role": "user", "content": "x" * 9000}]
        if chunked_prefill_field:
            assert the_llm().kwargs["enable_chunked_prefill"] is True
            _, _, fin = await collect(eng.generate("r", prompt, SamplingParams(max_tokens=4)))
            assert (fin.reason, fin.completion_tokens) == (FinishReason.LENGTH, 4)
        else:
            with pytest.raises(PromptTooLongError, match=r"at most 8192 prompt tokens"):
                eng.generate("r", prompt, SamplingParams())
            assert the_llm().requests == []
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_cuts_max_tokens_to_the_executors_limit(
    fake_trt: type[fake.LLM],
) -> None:
    """Defect 3, the project's answer to TensorRT-LLM shortening max_tokens on its own
    (base_worker.py `_deduce_max_tokens`, a warning only): we cut it ourselves against the limit
    the executor reports, so the reply ends `length` when the context is full (as on llama.cpp)
    and TensorRT-LLM never has to shorten anything behind our back."""
    fake_trt.executor_max_seq_len = 100
    fake_trt.script = ["tok "] * 1000
    eng = TrtLlmEngine(replace(SETTINGS, trtllm_in_process=True))
    await eng.start()
    try:
        prompt = the_llm().tokenizer.encode(  # type: ignore[union-attr]
            the_llm().tokenizer.apply_chat_template(
                USER, tokenize=False, add_generation_prompt=True
            ),  # type: ignore[union-attr]
            add_special_tokens=False,
        )
        _, _, fin = await collect(eng.generate("r", USER, SamplingParams(max_tokens=256)))
        assert fin.reason is FinishReason.LENGTH
        assert fin.completion_tokens == 100 - len(prompt)
        assert the_llm().requests[0].sampling_params.max_tokens == 100 - len(prompt)
        assert the_llm().warnings == []  # TensorRT-LLM did not have to shorten it
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_needs_the_event_loop_before_submitting(
    engine: TrtLlmEngine,
) -> None:
    """Defect 6: without a running loop TensorRT-LLM's result cannot be iterated
    (executor/result.py); the loop is looked up before anything is submitted, so such a call
    leaves no orphan request inside TensorRT-LLM."""
    with pytest.raises(RuntimeError):
        await asyncio.to_thread(engine.generate, "r", USER, SamplingParams())
    assert the_llm().requests == []
    assert engine.stats().running == 0


async def test_trtllm_adapter_against_fake_responses_with_several_tokens(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    """A response may carry several tokens (stream_interval, speculative decoding): all are
    counted, and a stop string inside one ends the reply there."""
    fake_trt.response_tokens = 3
    fake_trt.script = ["a", "b", "c", "d", "e", "f", "g"]
    text, deltas, fin = await collect(engine.generate("r", USER, SamplingParams()))
    assert text == "abcdefg"
    assert [len(d.token_ids) for d in deltas] == [3, 3, 1]
    assert fin.completion_tokens == 7
    fake_trt.script = ["Hi", " X", "YZ", " never"] + ["x"] * 100
    text, _, fin = await collect(engine.generate("s", USER, SamplingParams(stop=("XY",))))
    assert (text, fin.reason, fin.completion_tokens) == ("Hi ", FinishReason.STOP, 3)


async def test_trtllm_adapter_against_fake_stop_string_is_not_counted_as_cancelled(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    """Defect 6: ending a request on a stop string aborts it inside TensorRT-LLM, which then
    reports "cancelled"; the engine's own counts must say stop_string."""
    fake_trt.script = ["Hi", " there", "\n\nUser:", " more"] + ["x"] * 1000
    _, _, fin = await collect(engine.generate("r", USER, SamplingParams(stop=("\n\nUser:",))))
    assert fin.reason is FinishReason.STOP
    for _ in range(200):
        if engine.stats().extra.get("trt_finish_stop_string"):
            break
        await asyncio.sleep(0.005)
    extra = engine.stats().extra
    assert extra["trt_finish_stop_string"] == 1.0
    assert "trt_finish_cancelled" not in extra


async def test_trtllm_adapter_against_fake_background_error_shuts_the_engine_down(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    """A failure in the executor loop gives every active request an error response; the next
    submission raises the error and shuts the LLM down (executor.py `_handle_background_error`),
    and every later one gets "LLM is shutting down": the stream ends `error`, and each later
    request is "unavailable" (503), however the error is typed."""
    fake_trt.script = ["tok "] * 10_000
    fake_trt.fail_after = 5
    _, _, fin = await collect(engine.generate("r", USER, SamplingParams(max_tokens=10_000)))
    assert fin.reason is FinishReason.ERROR and fin.error and "fake executor died" in fin.error
    for _ in range(2):
        with pytest.raises(EngineUnavailableError):
            engine.generate("late", USER, SamplingParams())
    assert len(the_llm().requests) == 1
    assert engine.stats().running == 0


async def test_trtllm_adapter_against_fake_owner_is_accepted(engine: TrtLlmEngine) -> None:
    """The contract's `owner` key: TensorRT-LLM schedules requests itself, so it is accepted and
    changes nothing here."""
    text, _, fin = await collect(engine.generate("r", USER, SamplingParams(), owner="user-1"))
    assert (text, fin.reason) == ("Hello, world!", FinishReason.STOP)


async def test_trtllm_adapter_against_fake_dead_worker_fails_replies_and_restarts(
    fake_trt: type[fake.LLM],
) -> None:
    """Issue 23 item 4: the worker process dies without a word (kill -9): its requests get no
    response ever (proxy.py `mpi_done_callback` only queues the error). Every open reply ends
    `error` within seconds, its text so far delivered; the engine says why it is unavailable
    (/readyz: 503) until a new LLM is up, and then serves again."""
    fake_trt.script = ["tok "] * 100_000
    eng = TrtLlmEngine(SETTINGS)
    await eng.start()
    try:
        streams = [
            eng.generate(f"r{i}", USER, SamplingParams(max_tokens=100_000), owner="u")
            for i in range(SETTINGS.max_seqs + 2)  # two also wait in the fair queue
        ]
        seen = await run_until_tokens(streams[0], 3)
        the_llm().kill_worker()
        results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), 5)
        for _, _, fin in results:
            assert fin.reason is FinishReason.ERROR
            assert fin.error and "worker process exited" in fin.error
        assert "".join(d.text for d in seen).startswith("tok tok tok")  # streamed before
        assert results[0][2].completion_tokens >= 3  # ... and counted in the end
        for _ in range(500):
            if eng.stats().unavailable is None:
                break
            assert "worker process exited" in (eng.stats().unavailable or "")
            await asyncio.sleep(0.01)
        assert eng.stats().unavailable is None
        assert len(fake.LLM.instances) == 2 and fake.LLM.instances[0]._executor.is_shutdown()
        fake_trt.script = list(fake._DEFAULT_SCRIPT)
        text, _, fin = await collect(eng.generate("after", USER, SamplingParams()))
        assert (text, fin.reason) == ("Hello, world!", FinishReason.STOP)
        assert eng.stats().running == 0
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_dead_worker_while_restarting_is_unavailable(
    fake_trt: type[fake.LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the new LLM is being built, a request is refused as unavailable (503) with the
    reason, not queued behind a dead executor."""
    eng = TrtLlmEngine(SETTINGS)
    await eng.start()
    try:
        building = asyncio.Event()

        def slow_build(*args: object, **kwargs: object) -> None:
            building.set()
            raise RuntimeError("CUDA error: no device")

        monkeypatch.setattr(fake.LLM, "__init__", slow_build)
        the_llm().kill_worker()
        await asyncio.wait_for(building.wait(), 5)
        with pytest.raises(EngineUnavailableError, match="worker process exited"):
            eng.generate("r", USER, SamplingParams())
        assert "restarting TensorRT-LLM failed" in (eng.stats().unavailable or "")
    finally:
        await eng.shutdown()


async def test_trtllm_adapter_against_fake_admits_fairly_across_owners(
    fake_trt: type[fake.LLM],
) -> None:
    """Issue 23 item 7: TensorRT-LLM's own queue is first come first served; the adapter holds
    the app's fair queue in front of max_batch_size: a newcomer's request goes in at the next
    free slot, ahead of the backlog of an owner who already has requests running."""
    fake_trt.script = ["tok "] * 30
    eng = TrtLlmEngine(replace(SETTINGS, max_seqs=2))
    await eng.start()
    try:
        flood = [
            eng.generate(f"a{i}", USER, SamplingParams(max_tokens=30), owner="alice")
            for i in range(6)
        ]
        late = eng.generate("b0", USER, SamplingParams(max_tokens=30), owner="bob")
        assert len(the_llm().requests) == 2  # max_batch_size handed over, the rest wait here
        assert eng.stats().waiting == 5
        _, _, fin_b = await collect(late)
        results = await asyncio.gather(*(collect(s) for s in flood))
        admitted = sorted(
            [(fin.admitted_at, f"a{i}") for i, (_, _, fin) in enumerate(results)]
            + [(fin_b.admitted_at, "b0")]
        )
        assert [rid for _, rid in admitted][:3] in (["a0", "a1", "b0"], ["a1", "a0", "b0"])
        assert eng.stats().waiting == 0 and eng.stats().running == 0
    finally:
        await eng.shutdown()
