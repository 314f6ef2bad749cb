"""A FAKE of the small part of TensorRT-LLM's LLM API that `app.engine.trtllm` uses. Not TensorRT-LLM.

TensorRT-LLM needs an NVIDIA GPU and cannot be installed here, so the adapter's tests run against
this stand-in, injected as `sys.modules["tensorrt_llm"]`. It mirrors the documented surface (read
from NVIDIA/TensorRT-LLM: tensorrt_llm/llmapi/llm.py, tensorrt_llm/executor/result.py,
tensorrt_llm/sampling_params.py, tensorrt_llm/tokenizer/tokenizer.py) as closely as the adapter
needs, and no more:

- `LLM(model, **kwargs)`: unknown keyword arguments raise ValueError ("got invalid argument"), as
  the real constructor does; `.tokenizer` with `apply_chat_template(...)`/`encode(...)`;
  `generate_async(inputs, sampling_params=None, streaming=False)` returns a `RequestOutput` and must
  be called with an event loop running (the real result queue binds to it); `get_stats_async`,
  `shutdown`;
- `SamplingParams`: a keyword-only dataclass whose `max_tokens` defaults to 32;
- `RequestOutput`: `async for` yields itself once per response until the final one; `.outputs[0]` is
  a `CompletionOutput` with `text`, `token_ids`, `text_diff`, `token_ids_diff` and `finish_reason`
  in {None, "stop", "length", "timeout", "cancelled"}; `.finished`; `.abort()` makes the runtime
  end the request with a final response whose finish_reason is "cancelled".

The "model" replies with the pieces in `LLM.script` (one token each, an empty piece being a token
whose text is not complete yet), then ends with "stop" (end of sequence). What each test needs to
inspect is recorded on the instances (`LLM.instances`, `LLM.requests`, `RequestOutput.abort_calls`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__version__ = "0.0.0+fake"

STEP_S = 0.001  # the fake runtime's iteration time

# Keyword arguments the fake LLM accepts, beside `model` (a subset of the real LlmArgs fields).
KNOWN_LLM_ARGS = frozenset(
    {
        "tokenizer",
        "max_seq_len",
        "max_batch_size",
        "max_num_tokens",
        "enable_iter_perf_stats",
        "kv_cache_config",
        "backend",
        "tensor_parallel_size",
        "trust_remote_code",
    }
)


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """The fields of tensorrt_llm.SamplingParams the adapter may set (same names and defaults)."""

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
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True


@dataclass(slots=True)
class CompletionOutput:
    """Mirrors tensorrt_llm.executor.result.CompletionOutput: the diffs are since the last response."""

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
    error: BaseException | None = None


class RequestOutput:
    """Mirrors tensorrt_llm.llmapi.RequestOutput as returned by `LLM.generate_async`."""

    def __init__(
        self, request_id: int, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = params
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self.abort_calls = 0  # for tests: how often abort() was called
        self._queue: asyncio.Queue[_Response] = asyncio.Queue()

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self.abort_calls += 1
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def _handle(self, response: _Response) -> None:
        if response.error is not None:
            raise response.error
        out = self._outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        out.token_ids.extend(response.token_ids)
        out._last_text_len = len(out.text)
        out.text += response.text
        self._done = response.is_final
        if response.finish_reason == "cancelled" or (self._done and response.finish_reason):
            out.finish_reason = response.finish_reason

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        self._handle(await self._queue.get())
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
        return "".join(chr(i) for i in token_ids if i > 1)


class LLM:
    """The fake runtime: one asyncio task per request emits one token per `STEP_S`."""

    instances: ClassVar[list[LLM]] = []  # every LLM built since the last `reset()`
    script: ClassVar[list[str]] = ["Hello", ",", " wor", "ld", "!"]
    end_with: ClassVar[str | None] = (
        None  # force a final finish_reason, e.g. "timeout" or "cancelled"
    )
    fail_after: ClassVar[int | None] = None  # raise from the result stream after this many tokens
    stats: ClassVar[list[dict[str, Any]]] = []  # what get_stats_async yields
    reject_kwargs: ClassVar[frozenset[str]] = frozenset()  # pretend an older version lacks these

    def __init__(self, model: str, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in KNOWN_LLM_ARGS or key in self.reject_kwargs:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
        self.model = model
        self.kwargs = kwargs
        self.single_process_env = os.environ.get("TLLM_WORKER_USE_SINGLE_PROCESS")
        self.built_on_thread = threading.current_thread()
        self.tokenizer: FakeTokenizer | None = FakeTokenizer()
        self.requests: list[RequestOutput] = []
        self.inputs: list[Any] = []
        self.is_shutdown = False
        self.args = _Args(kwargs.get("max_seq_len"))
        self._tasks: set[asyncio.Task[None]] = set()
        LLM.instances.append(self)

    @classmethod
    def reset(cls) -> None:
        cls.instances = []
        cls.script = ["Hello", ",", " wor", "ld", "!"]
        cls.end_with = None
        cls.fail_after = None
        cls.stats = []
        cls.reject_kwargs = frozenset()

    def generate_async(
        self,
        inputs: str | list[int],
        sampling_params: SamplingParams | None = None,
        streaming: bool = False,
        **kwargs: Any,
    ) -> RequestOutput:
        if self.is_shutdown:
            raise RuntimeError("LLM is shutting down")
        loop = asyncio.get_running_loop()  # the real result queue needs the caller's loop
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(inputs, str):
            prompt_ids = self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)  # type: ignore[union-attr]
        elif isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
            prompt_ids = list(inputs)
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        limit = self.args.max_seq_len
        if limit is not None and len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(
                f"The sum of prompt length ({len(prompt_ids)}) and max_tokens "
                f"({params.max_tokens}) should not exceed max_seq_len ({limit})"
            )
        self.inputs.append(inputs)
        result = RequestOutput(len(self.requests), prompt_ids, params)
        self.requests.append(result)
        task = loop.create_task(self._run(result, streaming))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return result

    async def _run(self, result: RequestOutput, streaming: bool) -> None:
        params = result.sampling_params
        queue = result._queue
        text, ids, n = "", [], 0
        while True:
            await asyncio.sleep(STEP_S)
            if result._aborted or self.is_shutdown:
                queue.put_nowait(_Response(ids, text, True, "cancelled"))
                return
            if self.fail_after is not None and n >= self.fail_after:
                queue.put_nowait(_Response([], "", True, None, RuntimeError("fake executor died")))
                return
            if n >= len(self.script):
                reason = self.end_with or "stop"
                queue.put_nowait(_Response(ids, text, True, reason))
                return
            piece = self.script[n]
            n += 1
            ids.append(1000 + n)
            text += piece
            if n >= params.max_tokens:
                queue.put_nowait(_Response(ids, text, True, self.end_with or "length"))
                return
            if streaming:
                queue.put_nowait(_Response(ids, text, False, None))
                text, ids = "", []

    async def _stats(self) -> AsyncIterator[dict[str, Any]]:
        for stat in self.stats:
            yield stat

    def get_stats_async(self, timeout: float | None = 2) -> AsyncIterator[dict[str, Any]]:
        return self._stats()

    def shutdown(self) -> None:
        self.is_shutdown = True


@dataclass
class _Args:
    max_seq_len: int | None
