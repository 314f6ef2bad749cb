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
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.trtllm import SINGLE_PROCESS_ENV, TrtLlmEngine, TrtLlmUnavailableError
from app.settings import EngineSettings
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


async def collect(stream: AsyncIterator[EngineEvent]) -> tuple[str, list[TextDelta], Finished]:
    deltas: list[TextDelta] = []
    finished: list[Finished] = []
    async for event in stream:
        assert not finished, "nothing may follow Finished"
        if isinstance(event, TextDelta):
            deltas.append(event)
        else:
            finished.append(event)
    assert len(finished) == 1
    return "".join(d.text for d in deltas), deltas, finished[0]


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
    assert no_top_k.top_k is None and no_top_k.seed is None


async def test_trtllm_adapter_against_fake_abort_cancels_via_request_output_abort(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = ["tok "] * 10_000
    stream = engine.generate("r", USER, SamplingParams(max_tokens=10_000))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    assert engine.stats().running == 1
    engine.abort("r")
    engine.abort("r")  # idempotent
    engine.abort("no-such-request")
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    assert 1 <= fin.completion_tokens < 10_000
    request = the_llm().requests[0]
    assert request.abort_calls == 1
    assert request.outputs[0].finish_reason == "cancelled"  # the runtime confirmed it
    assert engine.stats().running == 0
    assert engine.stats().extra["trt_finish_cancelled"] == 1.0
    engine.abort("r")  # after the end: harmless


async def test_trtllm_adapter_against_fake_abort_from_another_thread(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = ["tok "] * 10_000
    stream = engine.generate("r", USER, SamplingParams(max_tokens=10_000))
    await anext(stream)
    await asyncio.to_thread(engine.abort, "r")
    _, _, fin = await collect(stream)
    assert fin.reason is FinishReason.CANCELLED
    assert the_llm().requests[0].abort_calls == 1


async def test_trtllm_adapter_against_fake_closing_the_stream_aborts(
    engine: TrtLlmEngine, fake_trt: type[fake.LLM]
) -> None:
    fake_trt.script = ["tok "] * 10_000
    stream = engine.generate("r", USER, SamplingParams(max_tokens=10_000))
    await anext(stream)
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
    with caplog.at_level(logging.WARNING, logger="app.engine.trtllm"):
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
    with caplog.at_level(logging.INFO, logger="app.engine.trtllm"):
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
    monkeypatch.setattr("app.engine.trtllm.STATS_POLL_S", 0.01)
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
        if engine.stats().kv_used == 0 and engine.stats().waiting == 0:
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
