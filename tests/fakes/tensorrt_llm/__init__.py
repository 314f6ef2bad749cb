"""A FAKE `tensorrt_llm` (1.0.x, PyTorch backend): the part of its LLM API that streamchat uses.

TensorRT-LLM needs an NVIDIA GPU and cannot run here, so `app.engine.trtllm.engine` is tested against this
stand-in: in-process (tests put it in `sys.modules`) and in a real server process (a test server
gets `PYTHONPATH=tests/fakes`, so that `import tensorrt_llm` finds this package). It is not
TensorRT-LLM; every behaviour below is modelled on NVIDIA/TensorRT-LLM's own sources, cited where
it is implemented:

- `LLM(model, **kwargs)` accepts only fields of `llmapi.TorchLlmArgs` (1.0's fields, see
  `llmapi/__init__.py`), builds its tokenizer, reads TLLM_WORKER_USE_SINGLE_PROCESS once per
  process (`llmapi/utils.py`: `enable_worker_single_process_for_tp1` is `@cache`d) and reports the
  executor's `max_seq_len`, which the model engine may lower (`executor/base_worker.py`:
  "max_seq_len might be updated by model engine");
- `generate_async` raises RuntimeError("LLM is shutting down") once the executor is shut down
  (`llmapi/llm.py`), re-raises a background error once and shuts the LLM down
  (`executor/executor.py` `_handle_background_error`), refuses bad input with TypeError, and
  wraps what the worker refuses in `RequestError` (`executor/base_worker.py` `_enqueue_request`:
  `_deduce_max_tokens` shortens a `max_tokens` that does not fit `max_seq_len` with a warning and
  refuses a prompt that leaves no room);
- the executor (`_torch/pyexecutor/py_executor.py`) runs one loop: a waiting queue, at most
  `max_batch_size` active requests, one iteration per `STEP_S`. A cancelled request still in the
  waiting queue is dropped with no response at all (`_handle_canceled_requests` ->
  `update_waiting_queue`); an active one is finished with reason CANCELLED at the next iteration,
  after the tokens of the iteration already in flight (the overlap scheduler), so responses
  arrive after `abort()`;
- a response may carry several tokens (`RESPONSE_TOKENS`, like `stream_interval` > 1);
- the sampler (`_torch/pyexecutor/sampler.py`, 1.0): unless `enable_trtllm_sampler` or
  `enable_mixed_sampler` is set, TorchSampler takes a batch-wide greedy fast path (argmax) and
  ignores every request's temperature, top-p and top-k. A sampled token here is drawn from a
  `random.Random(seed)` per request, so two unseeded requests differ and two with one seed agree;
- iteration stats (`get_stats_async`) come from one shared queue: whoever reads a stat consumes it
  (`executor/executor.py` `IterationResultQueue`);
- `RequestOutput` (`executor/result.py`): `async for` needs the event loop that was running when
  the request was made (without one, the result has no async queue and iterating it fails);
  `abort()` asks the executor to cancel (`base_worker.abort_request`).

The "model" answers every prompt with `LLM.script` (one piece of text per token; an empty piece is
a token whose text is not complete yet), then the end-of-sequence token ("stop"), or, with
`LLM.script = None` (the default in a server process, env FAKE_TRTLLM_ENDLESS=1), " w1 w2 ..." up to
`max_tokens`, or exactly N words then end-of-sequence when the prompt holds `[[synthetic:tokens=N]]`
(the synthetic engine's marker, so that tests written for it run on this fake too). Tests inspect
`LLM.instances`, `.requests`, `RequestOutput.abort_calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .executor.utils import RequestError
from .llmapi import TorchLlmArgs
from .llmapi.utils import enable_worker_single_process_for_tp1

__version__ = os.environ.get("FAKE_TRTLLM_VERSION", "1.0.0+fake")
__all__ = ["LLM", "RequestError", "SamplingParams"]

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
        self.sampled = False  # for tests: whether the sampler honoured this request's sampling
        # executor/result.py: the async queue exists only when a loop runs at creation
        try:
            asyncio.get_running_loop()
            self._aqueue: asyncio.Queue[_Response] | None = asyncio.Queue()
        except RuntimeError:
            self._aqueue = None

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
        if self._aqueue is not None:
            self._aqueue.put_nowait(response)

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
    """The PyExecutor's state that the LLM object can see."""

    def __init__(self, max_seq_len: int | None) -> None:
        self.max_seq_len = max_seq_len
        self._shutdown = False

    def is_shutdown(self) -> bool:
        return self._shutdown


_DEFAULT_SCRIPT = ["Hello", ",", " wor", "ld", "!"]
_LENGTH_MARKER = re.compile(r"\[\[synthetic:tokens=(\d+)\]\]")
_ENDLESS = os.environ.get("FAKE_TRTLLM_ENDLESS") == "1"


class LLM:
    """The fake runtime: an executor loop (an asyncio task) running one iteration per STEP_S."""

    instances: ClassVar[list[LLM]] = []  # every LLM built since the last `reset()`
    script: ClassVar[list[str] | None] = None if _ENDLESS else list(_DEFAULT_SCRIPT)
    end_with: ClassVar[str | None] = None  # force a final finish_reason, e.g. "timeout"
    fail_after: ClassVar[int | None] = None  # a background error after this many iterations
    executor_max_seq_len: ClassVar[int | None] = None  # the model engine lowers max_seq_len
    response_tokens: ClassVar[int] = 1  # tokens per streamed response
    reject_next: ClassVar[str | None] = None  # the worker refuses the next request with this

    def __init__(self, model: str, **kwargs: Any) -> None:
        fields = TorchLlmArgs.model_fields
        for key in kwargs:
            if key not in fields:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
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
        self.args = _Args(
            backend=kwargs.get("backend") or "pytorch",
            max_seq_len=kwargs.get("max_seq_len"),
            max_batch_size=kwargs.get("max_batch_size") or 2048,
            max_num_tokens=kwargs.get("max_num_tokens"),
        )
        limit = self.args.max_seq_len
        if self.executor_max_seq_len is not None:
            limit = min(limit or self.executor_max_seq_len, self.executor_max_seq_len)
        self._max_seq_len = limit  # what the worker enforces
        # In-process, `_executor` is the worker itself, which keeps the executor's max_seq_len
        # (base_worker.py); the proxy to a worker process does not have it.
        self._executor = _Executor(limit if self.in_process else None)
        # _torch/pyexecutor/sampler.py (1.0): the greedy fast path unless one of these is set;
        # from 1.1 (no enable_mixed_sampler field) TorchSampler samples each request its own way
        if kwargs.get("enable_trtllm_sampler") or kwargs.get("sampler_type") == "TRTLLMSampler":
            self.sampler = "TRTLLMSampler"
        elif kwargs.get("enable_mixed_sampler") or "enable_mixed_sampler" not in fields:
            self.sampler = "TorchSampler"
        else:
            self.sampler = "TorchSampler(greedy fast path)"
        self.requests: list[RequestOutput] = []
        self.inputs: list[Any] = []
        self.warnings: list[str] = []
        self.waiting: deque[_Active] = deque()
        self.active: list[_Active] = []
        self.iteration = 0
        self._stats: deque[dict[str, Any]] = deque(maxlen=1000)  # one shared queue
        self._errors: deque[BaseException] = deque()
        self._loop_task: asyncio.Task[None] | None = None
        LLM.instances.append(self)

    @classmethod
    def reset(cls) -> None:
        cls.instances = []
        cls.script = list(_DEFAULT_SCRIPT)
        cls.end_with = None
        cls.fail_after = None
        cls.executor_max_seq_len = None
        cls.response_tokens = 1
        cls.reject_next = None

    # -- the LLM API ----------------------------------------------------------------------------

    def generate_async(
        self,
        inputs: str | list[int],
        sampling_params: SamplingParams | None = None,
        streaming: bool = False,  # the fake always streams; the adapter always asks it to
        **kwargs: Any,
    ) -> RequestOutput:
        if self._executor.is_shutdown():  # llm.py generate_async
            raise RuntimeError("LLM is shutting down")
        if self._errors:  # executor.py _handle_background_error: raise it and shut down
            error = self._errors.popleft()
            self.shutdown()
            raise error
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(inputs, str):
            prompt_ids = self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)  # type: ignore[union-attr]
        elif isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
            prompt_ids = list(inputs)
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        params.max_tokens = self._deduce_max_tokens(len(prompt_ids), params.max_tokens)
        if self.reject_next is not None:  # e.g. base_worker: "Failed to load LoRA adapter: ..."
            message, LLM.reject_next = self.reject_next, None
            raise RequestError(message)
        self.inputs.append(inputs)
        result = RequestOutput(self, len(self.requests), prompt_ids, params)
        self.requests.append(result)
        sampled = not params.greedy and self.sampler != "TorchSampler(greedy fast path)"
        result.sampled = sampled
        rng = random.Random(params.seed) if sampled else None
        markers = _LENGTH_MARKER.findall(FakeTokenizer().decode(prompt_ids))
        self.waiting.append(_Active(result, rng, int(markers[-1]) if markers else None))
        self._ensure_loop()
        return result

    def _deduce_max_tokens(self, prompt_len: int, max_tokens: int) -> int:
        """base_worker.py `_deduce_max_tokens`, its errors wrapped as `_enqueue_request` does."""
        max_seq_len = self._max_seq_len
        if max_seq_len is None:
            return max_tokens
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
        self._executor._shutdown = True
        if self._loop_task is not None:
            self._loop_task.cancel()

    # -- the executor ---------------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop_task is not None and not self._loop_task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # nothing runs without a loop; the request just waits
        self._loop_task = loop.create_task(self._run())

    def _cancel(self, result: RequestOutput) -> None:
        for entry in self.waiting:
            if entry.result is result:  # never scheduled: removed, and no response at all
                self.waiting.remove(entry)
                return
        for entry in self.active:
            if entry.result is result and entry.cancel_at is None:
                entry.cancel_at = self.iteration + 2  # after the iteration already in flight

    async def _run(self) -> None:
        # py_executor.py: an idle executor waits for requests; no iterations, no stats
        with contextlib.suppress(asyncio.CancelledError):
            while not self._executor.is_shutdown() and (self.waiting or self.active):
                await asyncio.sleep(STEP_S)
                self._iterate()

    def _iterate(self) -> None:
        self.iteration += 1
        if self.fail_after is not None and self.iteration > self.fail_after:
            # py_executor.py _handle_errors: every active request gets an error response; the
            # error also goes to the error queue, raised by the next submission
            for entry in self.active:
                entry.result._put(_Response([], "", True, None, error="fake executor died"))
            self.active.clear()
            self._errors.append(RuntimeError("fake executor died: CUDA error"))
            self.fail_after = None
            return
        while self.waiting and len(self.active) < self.args.max_batch_size:
            self.active.append(self.waiting.popleft())
        for entry in list(self.active):
            if entry.cancel_at is not None and self.iteration >= entry.cancel_at:
                entry.result._put(_Response([], "", True, "cancelled"))
                self.active.remove(entry)
                continue
            self._step(entry)
        self._stats.append(
            {
                "iter": self.iteration,
                "iterLatencyMS": STEP_S * 1000,
                "numActiveRequests": len(self.active),
                "numQueuedRequests": len(self.waiting),
                "kvCacheStats": {
                    "usedNumBlocks": sum(
                        -(-(len(e.result.prompt_token_ids) + e.n) // TOKENS_PER_BLOCK)
                        for e in self.active
                    ),
                    "maxNumBlocks": MAX_BLOCKS,
                    "tokensPerBlock": TOKENS_PER_BLOCK,
                },
            }
        )

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
class _Args:
    backend: str
    max_seq_len: int | None
    max_batch_size: int
    max_num_tokens: int | None
