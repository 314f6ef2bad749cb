"""A FAKE `tensorrt_llm` (1.0 to 1.4, PyTorch backend): the part of its LLM API that streamchat uses.

TensorRT-LLM needs an NVIDIA GPU and cannot run here, so `app.engine.trtllm` is tested against this
stand-in: in-process (tests put it in `sys.modules`) and in a real server process (a test server
gets `PYTHONPATH=tests/fakes`, so that `import tensorrt_llm` finds this package). It is not
TensorRT-LLM; every behaviour below is modelled on NVIDIA/TensorRT-LLM's own sources, cited where
it is implemented, rough edges included. The release is `__version__` (env FAKE_TRTLLM_VERSION,
default 1.0.0; a test may monkeypatch it, with `llmapi.TorchLlmArgs.model_fields` to match):

- `LLM(model, **kwargs)` accepts only fields of `llmapi.TorchLlmArgs`, builds its tokenizer, reads
  TLLM_WORKER_USE_SINGLE_PROCESS once per process (`llmapi/utils.py`: `@cache`d), and has the
  worker enforce `max_seq_len` capped by the model's positions and by what the model engine
  allows (`executor/base_worker.py`: "max_seq_len might be updated by model engine"); only the
  in-process worker (`_executor`) shows that limit, the proxy to a worker process does not;
- the sampler (`_torch/pyexecutor/sampler.py`, docs `features/sampling.md` per release): the
  TRTLLM sampler (1.0 `enable_trtllm_sampler`, 1.1-1.3 `sampler_type="TRTLLMSampler"`, deprecated
  in 1.3, rejected by 1.4) applies every field and seeds an unseeded request with 0, so unseeded
  replies repeat (NVIDIA/TensorRT-LLM#1000); 1.0's TorchSampler decodes greedily for the whole
  batch unless `enable_mixed_sampler`; later TorchSamplers draw from one generator seeded 42 for
  all requests (`self._global_seed = 42`: `seed` is ignored) and apply the penalties only from 1.3.
  Each request records the fields the sampler `honoured` and `ignored`;
- `generate_async` raises RuntimeError("LLM is shutting down") once the executor is shut down
  (`llmapi/llm.py`), re-raises a background error once and shuts the LLM down
  (`executor/executor.py` `_handle_background_error`), refuses bad input with TypeError and, without
  chunked prefill, a prompt over `max_num_tokens` (default 8192) with `RequestError`
  (`llm.py` `_check_arguments`). What the worker refuses (`base_worker.py` `_enqueue_request`,
  `_deduce_max_tokens`) raises `RequestError` in-process; with a worker process the proxy does
  not wait for the worker, which sends it back as an `ErrorResponse` on the request's stream
  (`worker.py` `worker_main`; TensorRT-LLM's test `test_rejected_submission_reaches_response_stream`),
  so iterating the result raises `RequestError` (`result.py` `_handle_response`);
- `cache_salt` (`llm.py` `generate_async`, later 1.x): block reuse (on by default,
  `KvCacheConfig.enable_block_reuse`) matches a prompt's full blocks only against blocks cached
  under the same salt; each request records `reused_blocks`. A test models an older release by
  swapping in `LLM.generate_async_before_cache_salt`;
- the executor (`_torch/pyexecutor/py_executor.py`) runs in its own thread: a waiting queue, at
  most `max_batch_size` active requests, one iteration per `STEP_S`, first come first served. A
  cancelled request still waiting is dropped with no response at all (`_handle_canceled_requests`
  -> `update_waiting_queue`); an active one ends CANCELLED at the next iteration, after the tokens
  of the iteration in flight (the overlap scheduler). Responses reach the caller's loop from that
  thread through `loop.call_soon_threadsafe` (`llmapi/utils.py` `_SyncQueue.notify_many`);
- a worker process that dies (`kill_worker()`: kill -9, a CUDA fault, the OOM killer) says
  nothing: its pending requests get no response ever; its MPI future ends with an error that
  `executor/proxy.py` `mpi_done_callback` only puts on `_error_queue`, raised by the next
  submission, which then shuts the LLM down;
- iteration stats (`get_stats_async`) come from one shared queue: whoever reads a stat consumes it
  (`executor/executor.py` `IterationResultQueue`), one per iteration that ran, none while idle;
- `RequestOutput` (`executor/result.py`): `async for` needs the event loop that was running when
  the request was made; `abort()` asks the executor to cancel (`base_worker.abort_request`).

The "model" answers every prompt with `LLM.script` (one piece of text per token; an empty piece is
a token whose text is not complete yet), then the end-of-sequence token ("stop"), or, with
`LLM.script = None` (the default in a server process, env FAKE_TRTLLM_ENDLESS=1), " w1 w2 ..." up to
`max_tokens`, or exactly N words then end-of-sequence when the prompt holds `[[synthetic:tokens=N]]`
(the synthetic engine's marker, so that tests written for it run on this fake too). Tests inspect
`LLM.instances`, `.requests`, `RequestOutput.abort_calls`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import random
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .executor.utils import RequestError
from .llmapi import KvCacheConfig, TorchLlmArgs, version_tuple
from .llmapi.utils import enable_worker_single_process_for_tp1

__version__ = os.environ.get("FAKE_TRTLLM_VERSION", "1.0.0+fake")
__all__ = ["LLM", "KvCacheConfig", "RequestError", "SamplingParams"]

log = logging.getLogger("tensorrt_llm")

STEP_S = float(os.environ.get("FAKE_TRTLLM_STEP_MS", "1")) / 1000  # one executor iteration
TOKENS_PER_BLOCK = 32
MAX_BLOCKS = 1000


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """tensorrt_llm.sampling_params.SamplingParams: the fields the adapter may set (same defaults)."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        # The LLM API's rule: all three unset, or temperature 0, top_p 0 or top_k 1, is greedy.
        if self.temperature is None and self.top_p is None and self.top_k is None:
            return True
        return self.temperature == 0 or self.top_p == 0 or self.top_k == 1


@dataclass(slots=True)
class CompletionOutput:
    """executor/result.py CompletionOutput: the diffs are since the previous response."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


@dataclass(slots=True)
class _Response:
    token_ids: list[int]
    text: str
    is_final: bool
    finish_reason: str | None
    error: str | None = None


class RequestOutput:
    """llmapi.RequestOutput as `LLM.generate_async` returns it."""

    def __init__(
        self, llm: LLM, request_id: int, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = params
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self.abort_calls = 0  # for tests
        self.sampled = False  # for tests: whether the sampler drew this request's tokens
        self.honoured: frozenset[str] = frozenset()  # for tests: set fields the sampler applied
        self.ignored: frozenset[str] = frozenset()  # ... and those it silently ignored
        self.cache_salt: str | None = None
        self.reused_blocks = 0  # for tests: prompt blocks found in the prefix cache
        # executor/result.py: the async queue exists only when a loop runs at creation
        self._loop: asyncio.AbstractEventLoop | None
        try:
            self._loop = asyncio.get_running_loop()
            self._aqueue: asyncio.Queue[_Response] | None = asyncio.Queue()
        except RuntimeError:
            self._loop, self._aqueue = None, None

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """result.py GenerationResult.abort -> executor.abort_request -> PyExecutor.cancel_request."""
        self.abort_calls += 1
        self._aborted = True
        self._llm._cancel(self)

    def aborted(self) -> bool:
        return self._aborted

    def _put(self, response: _Response) -> None:
        """From the executor's thread: llmapi/utils.py `_SyncQueue` hands each response to the
        caller's loop with `call_soon_threadsafe`."""
        if self._aqueue is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, response)

    def _handle(self, response: _Response) -> None:
        if response.error is not None:  # result.py _handle_response: an error response raises
            self._done = True
            raise RequestError(response.error)
        out = self._outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        out.token_ids.extend(response.token_ids)
        out._last_text_len = len(out.text)
        out.text += response.text
        self._done = response.is_final
        if self._done:
            out.finish_reason = response.finish_reason

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._aqueue is None:  # result.py _aresult_step's assertion
            raise AssertionError(
                "The asyncio event loop was not present during initialization, so async "
                "operations are not available."
            )
        self._handle(await self._aqueue.get())
        return self


class FakeTokenizer:
    """Stands in for TransformersTokenizer: a ChatML template and one token per character."""

    eos_token_id = 0

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, str]],
        *args: Any,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        if any(m.get("role") not in {"system", "user", "assistant"} for m in conversation):
            raise ValueError("Conversation roles must be system, user or assistant")
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text

    def encode(
        self, text: str, *args: Any, add_special_tokens: bool = True, **kwargs: Any
    ) -> list[int]:
        ids = [ord(ch) for ch in text]
        return [1, *ids] if add_special_tokens else ids  # 1: BOS

    def decode(self, token_ids: list[int], *args: Any, **kwargs: Any) -> str:
        return "".join(chr(i) for i in token_ids if 1 < i < 0x110000)


@dataclass(eq=False)
class _Active:
    result: RequestOutput
    rng: random.Random | None  # None: greedy
    length: int | None = None  # endless script: words before end-of-sequence (None: no end)
    n: int = 0  # tokens generated
    cancel_at: int | None = None  # iteration at which the cancel is handled


class _Executor:
    """What the LLM object holds of the executor: the in-process worker (which knows the
    enforced `max_seq_len`), or the proxy to a worker process (executor/proxy.py: `mpi_futures`,
    and `_error_queue`, where `mpi_done_callback` puts a dead worker's error)."""

    def __init__(self, max_seq_len: int | None, worker_process: bool) -> None:
        self.max_seq_len = max_seq_len
        self._shutdown = False
        self._error_queue: queue.Queue[BaseException] = queue.Queue()
        self.mpi_futures: list[concurrent.futures.Future[None]] = []
        if worker_process:
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()
            future.add_done_callback(self._mpi_done_callback)
            self.mpi_futures.append(future)

    def _mpi_done_callback(self, future: concurrent.futures.Future[None]) -> None:
        if future.exception() is not None:  # proxy.py: only queued, raised by a later call
            self._error_queue.put_nowait(future.exception())  # type: ignore[arg-type]

    def is_shutdown(self) -> bool:
        return self._shutdown


_DEFAULT_SCRIPT = ["Hello", ",", " wor", "ld", "!"]
_LENGTH_MARKER = re.compile(r"\[\[synthetic:tokens=(\d+)\]\]")
_ENDLESS = os.environ.get("FAKE_TRTLLM_ENDLESS") == "1"
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p")
_PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")
DEFAULT_MAX_NUM_TOKENS = 8192  # llmapi/llm_args.py BaseLlmArgs.max_num_tokens


class LLM:
    """The fake runtime: an executor thread running one iteration per STEP_S."""

    instances: ClassVar[list[LLM]] = []  # every LLM built since the last `reset()`
    script: ClassVar[list[str] | None] = None if _ENDLESS else list(_DEFAULT_SCRIPT)
    end_with: ClassVar[str | None] = None  # force a final finish_reason, e.g. "timeout"
    fail_after: ClassVar[int | None] = None  # a background error after this many iterations
    executor_max_seq_len: ClassVar[int | None] = None  # the model engine lowers max_seq_len
    model_positions: ClassVar[int] = 8192  # the model config's max_position_embeddings
    response_tokens: ClassVar[int] = 1  # tokens per streamed response
    reject_next: ClassVar[str | None] = None  # the worker refuses the next request with this

    def __init__(self, model: str, **kwargs: Any) -> None:
        fields = TorchLlmArgs.model_fields
        for key in kwargs:
            if key not in fields:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
        self.version = version_tuple(__version__)
        self.sampler = self._sampler(kwargs)
        self.model = model
        self.kwargs = kwargs
        self.in_process = enable_worker_single_process_for_tp1()  # cached: once per process
        if self.in_process:
            log.warning(
                "Using single process worker for TP1, this may hurt streaming generation "
                "performance."
            )
        self.built_on_thread = threading.current_thread()
        self.tokenizer: FakeTokenizer | None = FakeTokenizer()
        self._hf_model_config = _HfConfig(self.model_positions)
        self.args = _Args(
            backend=kwargs.get("backend") or "pytorch",
            max_seq_len=kwargs.get("max_seq_len"),
            max_batch_size=kwargs.get("max_batch_size") or 2048,
            max_num_tokens=kwargs.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS,
            enable_chunked_prefill=bool(kwargs.get("enable_chunked_prefill")),
            kv_cache_config=kwargs.get("kv_cache_config") or KvCacheConfig(),
        )
        limit = min(self.args.max_seq_len or self.model_positions, self.model_positions)
        if self.executor_max_seq_len is not None:
            limit = min(limit, self.executor_max_seq_len)
        self._max_seq_len = limit  # what the worker enforces
        self._executor = _Executor(limit if self.in_process else None, not self.in_process)
        self.requests: list[RequestOutput] = []
        self.inputs: list[Any] = []
        self.warnings: list[str] = []
        self.waiting: deque[_Active] = deque()
        self.active: list[_Active] = []
        self.iteration = 0
        self._torch_rng = random.Random(42)  # TorchSampler: one generator, `_global_seed = 42`
        self._cached_blocks: set[tuple[str | None, tuple[int, ...]]] = set()
        self._stats: deque[dict[str, Any]] = deque(maxlen=1000)  # one shared queue
        self._errors: deque[BaseException] = deque()
        self._dead = False
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="fake-trtllm-executor", daemon=True)
        self._thread.start()
        LLM.instances.append(self)

    def _sampler(self, kwargs: Mapping[str, Any]) -> str:
        """The sampler these arguments select in this release (see the package docstring)."""
        sampler_type = str(kwargs.get("sampler_type") or "auto")
        if sampler_type == "TRTLLMSampler" and self.version >= (1, 4):
            raise ValueError(
                "sampler_type='TRTLLMSampler' is no longer supported: TorchSampler is the only "
                "sampler"
            )
        if kwargs.get("enable_trtllm_sampler") or sampler_type == "TRTLLMSampler":
            if self.version >= (1, 3):
                log.warning("TRTLLMSampler is deprecated and will be removed in release 1.4")
            return "TRTLLMSampler"
        if self.version < (1, 1) and not kwargs.get("enable_mixed_sampler"):
            return "TorchSampler(greedy fast path)"
        return "TorchSampler"

    @classmethod
    def reset(cls) -> None:
        for llm in cls.instances:
            llm.shutdown()
        cls.instances = []
        cls.script = list(_DEFAULT_SCRIPT)
        cls.end_with = None
        cls.fail_after = None
        cls.executor_max_seq_len = None
        cls.model_positions = 8192
        cls.response_tokens = 1
        cls.reject_next = None

    # -- the LLM API ----------------------------------------------------------------------------

    def generate_async(
        self,
        inputs: str | list[int],
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        streaming: bool = False,  # the fake always streams; the adapter always asks it to
        cache_salt: str | None = None,
    ) -> RequestOutput:
        return self._generate(inputs, sampling_params, cache_salt)

    def generate_async_before_cache_salt(
        self,
        inputs: str | list[int],
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        streaming: bool = False,
    ) -> RequestOutput:
        """`generate_async` of a release without `cache_salt` (a test swaps it in)."""
        return self._generate(inputs, sampling_params, None)

    def _generate(
        self,
        inputs: str | list[int],
        sampling_params: SamplingParams | None,
        cache_salt: str | None,
    ) -> RequestOutput:
        if self._executor.is_shutdown():  # llm.py generate_async
            raise RuntimeError("LLM is shutting down")
        if self._errors or not self._executor._error_queue.empty():
            # executor.py _handle_background_error: raise the first error and shut down
            error = self._errors.popleft() if self._errors else self._executor._error_queue.get()
            self.shutdown()
            raise error
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(inputs, str):
            prompt_ids = self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)  # type: ignore[union-attr]
        elif isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
            prompt_ids = list(inputs)
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        self._check_arguments(len(prompt_ids))
        result = RequestOutput(self, len(self.requests), prompt_ids, params)
        result.cache_salt = cache_salt
        try:  # the worker's side: base_worker._enqueue_request
            params.max_tokens = self._deduce_max_tokens(len(prompt_ids), params.max_tokens)
            if self.reject_next is not None:  # e.g. "Failed to load LoRA adapter: ..."
                message, LLM.reject_next = self.reject_next, None
                raise RequestError(message)
        except RequestError as exc:
            if self.in_process:
                raise
            # worker.py worker_main: the proxy did not wait; the refusal comes on the stream
            self.requests.append(result)
            result._put(_Response([], "", True, None, error=str(exc)))
            return result
        self.inputs.append(inputs)
        self.requests.append(result)
        rng = self._rng_for(result)
        markers = _LENGTH_MARKER.findall(FakeTokenizer().decode(prompt_ids))
        with self._lock:
            self.waiting.append(_Active(result, rng, int(markers[-1]) if markers else None))
            self._lock.notify()
        return result

    def _check_arguments(self, prompt_len: int) -> None:
        """llm.py `_check_arguments` (PyTorch backend): without chunked prefill a prompt is
        prefilled in one iteration of at most `max_num_tokens` tokens."""
        if not self.args.enable_chunked_prefill and prompt_len > self.args.max_num_tokens:
            raise RequestError(
                f"The sum of prompt length ({float(prompt_len)}), query length (0) should not "
                f"exceed max_num_tokens ({self.args.max_num_tokens})"
            )

    def _rng_for(self, result: RequestOutput) -> random.Random | None:
        """What this release's sampler does with the request's sampling fields."""
        params = result.sampling_params
        given = {name for name in (*_SAMPLING_FIELDS, *_PENALTIES, "seed")}
        given = {name for name in given if getattr(params, name) is not None}
        if params.greedy or self.sampler == "TorchSampler(greedy fast path)":
            honoured = {"top_k"} & given if params.greedy else set()
            result.honoured, result.ignored = frozenset(honoured), frozenset(given - honoured)
            return None
        result.sampled = True
        if self.sampler == "TRTLLMSampler":  # every field; an unset seed is 0 (#1000)
            result.honoured, result.ignored = frozenset(given), frozenset()
            return random.Random(params.seed if params.seed is not None else 0)
        honoured = given & set(_SAMPLING_FIELDS)
        if self.version >= (1, 3):  # TorchSampler's penalties arrive in 1.3
            honoured |= given & set(_PENALTIES)
        result.honoured, result.ignored = frozenset(honoured), frozenset(given - honoured)
        return self._torch_rng  # one generator for every request: `seed` changes nothing

    def _deduce_max_tokens(self, prompt_len: int, max_tokens: int) -> int:
        """base_worker.py `_deduce_max_tokens`, its errors wrapped as `_enqueue_request` does."""
        max_seq_len = self._max_seq_len
        default_max_tokens = max_seq_len - prompt_len
        if default_max_tokens <= 0:
            raise RequestError(
                f"`default_max_tokens` ({default_max_tokens}) must be greater than 0, "
                f"`default_max_tokens` ({default_max_tokens}) = max_seq_len ({max_seq_len}) - "
                f"`splited_prompt_len` ({prompt_len})"
            )
        if max_tokens > default_max_tokens:
            warning = (
                f"User-specified `max_tokens` ({max_tokens}) is greater than deduced "
                f"`default_max_tokens` ({default_max_tokens}), using default_max_tokens instead."
            )
            self.warnings.append(warning)
            log.warning(warning)
            return default_max_tokens
        return max_tokens

    async def _stat_iter(self) -> AsyncIterator[dict[str, Any]]:
        while self._stats:
            yield self._stats.popleft()

    def get_stats_async(self, timeout: float | None = 2) -> AsyncIterator[dict[str, Any]]:
        return self._stat_iter()

    def shutdown(self) -> None:
        with self._lock:
            self._executor._shutdown = True
            self._lock.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def kill_worker(self) -> None:
        """The worker process dies without a word (kill -9, a CUDA fault, the OOM killer): no
        response ever comes for what it held; its MPI future fails (executor/proxy.py)."""
        assert self._executor.mpi_futures, "in-process, the whole server would die"
        with self._lock:
            self._dead = True
            self._lock.notify()
        self._executor.mpi_futures[0].set_exception(
            RuntimeError("MPI worker exited: signal 9 (Killed)")
        )

    # -- the executor ---------------------------------------------------------------------------

    def _cancel(self, result: RequestOutput) -> None:
        with self._lock:
            for entry in self.waiting:
                if entry.result is result:  # never scheduled: removed, and no response at all
                    self.waiting.remove(entry)
                    return
            for entry in self.active:
                if entry.result is result and entry.cancel_at is None:
                    entry.cancel_at = self.iteration + 2  # after the iteration already in flight

    def _run(self) -> None:
        # py_executor.py: an idle executor waits for requests; no iterations, no stats
        while True:
            with self._lock:
                while not (self._executor.is_shutdown() or self._dead) and not (
                    self.waiting or self.active
                ):
                    self._lock.wait()
                if self._executor.is_shutdown() or self._dead:
                    return
            time.sleep(STEP_S)
            with self._lock:
                if self._executor.is_shutdown() or self._dead:
                    return
                self._iterate()

    def _iterate(self) -> None:
        self.iteration += 1
        if self.fail_after is not None and self.iteration > self.fail_after:
            # py_executor.py _handle_errors: every active request gets an error response; the
            # error also goes to the error queue, raised by the next submission. Queued first, so
            # a client that reads its error response and submits again meets it (put after, a
            # fast client's next submission raced past it).
            self._errors.append(RuntimeError("fake executor died: CUDA error"))
            for entry in self.active:
                entry.result._put(_Response([], "", True, None, error="fake executor died"))
            self.active.clear()
            LLM.fail_after = None
            return
        while self.waiting and len(self.active) < self.args.max_batch_size:
            entry = self.waiting.popleft()
            self._reuse_blocks(entry.result)
            self.active.append(entry)
        self._stats.append(self._iteration_stats())  # the batch this iteration runs
        for entry in list(self.active):
            if entry.cancel_at is not None and self.iteration >= entry.cancel_at:
                entry.result._put(_Response([], "", True, "cancelled"))
                self.active.remove(entry)
                continue
            self._step(entry)

    def _reuse_blocks(self, result: RequestOutput) -> None:
        """KV block reuse: the prompt's leading full blocks already cached under its salt."""
        if not self.args.kv_cache_config.enable_block_reuse:
            return
        ids = result.prompt_token_ids
        keys = [
            (result.cache_salt, tuple(ids[:end]))
            for end in range(TOKENS_PER_BLOCK, len(ids) + 1, TOKENS_PER_BLOCK)
        ]
        for key in keys:
            if key not in self._cached_blocks:
                break
            result.reused_blocks += 1
        self._cached_blocks.update(keys)

    def _iteration_stats(self) -> dict[str, Any]:
        return {
            "iter": self.iteration,
            "iterLatencyMS": STEP_S * 1000,
            "numActiveRequests": len(self.active),
            "numQueuedRequests": len(self.waiting),
            "kvCacheStats": {
                "usedNumBlocks": sum(
                    -(-(len(e.result.prompt_token_ids) + e.n + 1) // TOKENS_PER_BLOCK)
                    for e in self.active
                ),
                "maxNumBlocks": MAX_BLOCKS,
                "tokensPerBlock": TOKENS_PER_BLOCK,
            },
        }

    def _step(self, entry: _Active) -> None:
        result, params = entry.result, entry.result.sampling_params
        ids: list[int] = []
        text = ""
        reason: str | None = None
        for _ in range(self.response_tokens):
            length = len(self.script) if self.script is not None else entry.length
            if length is not None and entry.n >= length:
                reason = self.end_with or "stop"  # the end-of-sequence token
                break
            entry.n += 1
            piece = self.script[entry.n - 1] if self.script is not None else f" w{entry.n}"
            offset = entry.rng.randrange(1, 10**6) if entry.rng is not None else 0
            ids.append(1000 + entry.n + offset * 1000)
            text += piece
            if entry.n >= params.max_tokens:
                reason = self.end_with or "length"
                break
        final = reason is not None
        if final:
            self.active.remove(entry)
        if final or ids:
            result._put(_Response(ids, text, final, reason))


@dataclass
class _HfConfig:
    max_position_embeddings: int


@dataclass
class _Args:
    backend: str
    max_seq_len: int | None
    max_batch_size: int
    max_num_tokens: int
    enable_chunked_prefill: bool
    kv_cache_config: KvCacheConfig
