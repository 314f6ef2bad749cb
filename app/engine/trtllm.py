"""TensorRT-LLM (>= 1.0, PyTorch backend) behind the engine contract, through its LLM API.

TensorRT-LLM batches, schedules and manages the KV cache itself; this adapter turns its per-request
async streams into our events. What it relies on was read in NVIDIA/TensorRT-LLM's sources (1.0
and the newer releases; paths relative to `tensorrt_llm/`), cited where it is used:

- the prompt is the model's chat template, tokenised once here (`add_special_tokens=False`: the
  template holds BOS already) and handed to `LLM.generate_async` as token ids, so TensorRT-LLM does
  not re-tokenise and `prompt_tokens` is what the model sees;
- `generate_async(ids, SamplingParams(...), streaming=True)` is called on the running event loop
  (executor/result.py: a result made without a running loop has no async queue and cannot be
  iterated) and followed by one task per request;
- `max_tokens` is always set (SamplingParams defaults to 32) and cut to what the context has room
  for, against the `max_seq_len` the executor reports (executor/base_worker.py: the model engine
  may lower it; its `_deduce_max_tokens` would otherwise shorten `max_tokens` itself with only a
  warning, or refuse the prompt). A reply cut by the context ends with `length`, as on llama.cpp;
- stop strings stay ours: `IncrementalDetokenizer` holds back a possible stop-string prefix exactly
  as on the CPU engines; on a stop string the reply ends with `stop` and the TensorRT-LLM request is
  aborted;
- Stop: `RequestOutput.abort()`. A request TensorRT-LLM has already answered ends with the final
  `cancelled` response it sends at its next iteration (ABORT_GRACE_S at the latest). One it has not
  answered yet may still sit in the executor's waiting queue, and such a request is dropped with
  no response at all (_torch/pyexecutor/py_executor.py `_handle_canceled_requests` ->
  `update_waiting_queue`): it ends `cancelled` at once, with no tokens, and whatever TensorRT-LLM
  still sends for it is drained and ignored;
- refusals: the worker wraps what it refuses in `RequestError`, a RuntimeError (executor/utils.py,
  executor/base_worker.py `_enqueue_request`); they become `EngineError` / `PromptTooLongError`
  (a 400). Only a shut-down LLM ("LLM is shutting down", llmapi/llm.py; or a background error,
  which executor/executor.py `_handle_background_error` raises once and then shuts the LLM down)
  is `EngineUnavailableError`.

Sampling: 1.0's TorchSampler takes a batch-wide greedy fast path unless the LLM is built with
`enable_trtllm_sampler` or `enable_mixed_sampler` (_torch/pyexecutor/sampler.py: `fast_path = not
self.enable_mixed_sampler and ...` -> argmax), silently ignoring temperature, top-p and top-k.
`sampler_options` picks, from the fields the installed version's `TorchLlmArgs` has, the option
that applies each request's sampling: where the fast path exists (the `enable_mixed_sampler` field
does), the TRTLLM sampler (it also honours the per-request seed); in later versions (1.1's
`sampler_type`, or no field at all) TorchSampler, which samples each request its own way there.
The choice is logged at start-up with the version and backend.

Worker process or not (`EngineSettings.trtllm_in_process`, env TRTLLM_IN_PROCESS, default off):
with one GPU the LLM API runs the executor in a spawned worker process and ships responses over
IPC; with TLLM_WORKER_USE_SINGLE_PROCESS=1 it runs in this process, and TensorRT-LLM itself warns
that this "may hurt streaming generation performance" (executor/executor.py `create`): the
executor's threads then share this interpreter's GIL with the web server, and a CUDA fault takes
the server down. The worker process is the default until bench/gpu_smoke.py measures otherwise
(it prints both). TensorRT-LLM reads the variable once per process (llmapi/utils.py:
`enable_worker_single_process_for_tp1` is `@cache`d): the adapter sets it only while it has not
been read, and reports the mode actually in effect (`stats().extra["trt_in_process"]`), warning
when that is not the one asked for.

`kv_cells` and `step_token_budget` do not apply (TensorRT-LLM sizes its KV cache from free GPU
memory and schedules tokens itself); `max_seqs` becomes `max_batch_size`, `context_size`
`max_seq_len`. `stats()`: `running` is our requests in flight; queue depth and KV use come from
TensorRT-LLM's iteration stats, polled once a request has been made. That queue is shared
(whoever reads a stat consumes it), so nothing else in the process may read it.

`tensorrt_llm` is imported only when the engine starts (it pulls in torch and CUDA); where it is not
installed, selecting this engine fails at once with `TrtLlmUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from app.engine.base import (
    ChatMessages,
    DuplicateRequestError,
    EngineError,
    EngineStats,
    EngineUnavailableError,
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.streams import EventStream
from app.settings import EngineSettings

log = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a Hugging Face name or a local directory
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"
MIN_VERSION = (1, 0)  # before 1.0, tensorrt_llm.LLM is the TensorRT-engine backend
ABORT_GRACE_S = 5.0  # an aborted request ends by then even if TensorRT-LLM never confirms it
STATS_POLL_S = 1.0
INSTALL_HINT = (
    "TensorRT-LLM is not installed. It needs an NVIDIA GPU with CUDA and comes from NVIDIA's "
    "package index, not PyPI: pip install -e '.[gpu]' --extra-index-url https://pypi.nvidia.com "
    "(see NVIDIA's TensorRT-LLM installation guide), or choose ENGINE=llamacpp or "
    "ENGINE=synthetic."
)

# TensorRT-LLM's CompletionOutput.finish_reason values, and what they mean here.
_FINISH_REASONS = {
    "stop": FinishReason.STOP,  # end-of-sequence token (or a stop word, which we never pass)
    "length": FinishReason.LENGTH,
    "cancelled": FinishReason.CANCELLED,
}
# What base_worker._deduce_max_tokens says when the prompt leaves no room for a reply.
_NO_ROOM = re.compile(r"max_seq_len|default_max_tokens|prompt length", re.IGNORECASE)


class TrtLlmUnavailableError(EngineUnavailableError):
    """`tensorrt_llm` cannot be imported on this machine, or is older than 1.0."""


class _NeverRaised(Exception):
    """Stands in for `RequestError` where a version does not define it."""


def tensorrt_llm_installed() -> bool:
    """Whether `tensorrt_llm` could be imported, without importing it (that costs seconds)."""
    if "tensorrt_llm" in sys.modules:
        return sys.modules["tensorrt_llm"] is not None
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


def import_tensorrt_llm() -> ModuleType:
    """Import `tensorrt_llm` (>= 1.0), turning every way that fails into one clear error."""
    try:
        trt = importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtLlmUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    except (OSError, RuntimeError) as exc:  # installed, but CUDA or a shared library is missing
        raise TrtLlmUnavailableError(
            f"tensorrt_llm is installed but failed to import: {exc}. It needs an NVIDIA GPU, "
            f"its CUDA runtime and a matching torch; see NVIDIA's TensorRT-LLM installation guide."
        ) from exc
    version = str(getattr(trt, "__version__", "0"))
    if version_tuple(version) < MIN_VERSION:
        raise TrtLlmUnavailableError(
            f"tensorrt_llm {version} is too old: this engine needs 1.0 or newer, where "
            f"tensorrt_llm.LLM is the PyTorch backend (before 1.0 it builds TensorRT engines). "
            f"pip install -e '.[gpu]' --extra-index-url https://pypi.nvidia.com"
        )
    return trt


def version_tuple(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def llm_arg_fields(trt: ModuleType) -> frozenset[str]:
    """The names `tensorrt_llm.LLM(...)` accepts: the fields of the PyTorch backend's arguments
    (llmapi/llm_args.py `TorchLlmArgs`, a pydantic model, also exported by `tensorrt_llm.llmapi`)."""
    for module in ("tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args"):
        with contextlib.suppress(ImportError):
            args = getattr(importlib.import_module(module), "TorchLlmArgs", None)
            fields = getattr(args, "model_fields", None)
            if isinstance(fields, dict) and fields:
                return frozenset(fields)
    log.warning("cannot read TensorRT-LLM's TorchLlmArgs: the sampler is left at its default")
    return frozenset()


def sampler_options(fields: frozenset[str]) -> tuple[dict[str, Any], str]:
    """The `LLM(...)` arguments under which each request's own sampling is applied, and the name
    of the sampler they select (see the module docstring).

    `enable_mixed_sampler` exists exactly where TorchSampler still has its batch-wide greedy fast
    path (1.0); there the TRTLLM sampler is chosen, through whichever field this version has for
    it, since it applies temperature, top-p, top-k and the seed per request. Elsewhere TorchSampler
    samples each request its own way."""
    if "enable_trtllm_sampler" in fields:  # 1.0
        return {"enable_trtllm_sampler": True}, "TRTLLMSampler (enable_trtllm_sampler=True)"
    if "enable_mixed_sampler" in fields:
        if "sampler_type" in fields:
            return {"sampler_type": "TRTLLMSampler"}, "TRTLLMSampler (sampler_type)"
        return {"enable_mixed_sampler": True}, "TorchSampler (enable_mixed_sampler=True)"
    if "sampler_type" in fields:  # 1.1+: TorchSampler applies each request's strategy
        return {"sampler_type": "TorchSampler"}, "TorchSampler (sampler_type='TorchSampler')"
    return {}, "TorchSampler (the only sampler in this version)"


def request_error_type() -> type[BaseException]:
    """TensorRT-LLM's per-request failure (executor/utils.py `RequestError(RuntimeError)`)."""
    for module in ("tensorrt_llm.executor.utils", "tensorrt_llm.executor"):
        with contextlib.suppress(ImportError):
            error = getattr(importlib.import_module(module), "RequestError", None)
            if isinstance(error, type) and issubclass(error, BaseException):
                return error
    return _NeverRaised


def apply_worker_mode(in_process: bool) -> bool:
    """Set TLLM_WORKER_USE_SINGLE_PROCESS for the LLM about to be built, unless this process has
    read it already (llmapi/utils.py caches the answer); return the mode in effect."""
    probe = None
    with contextlib.suppress(ImportError):
        utils = importlib.import_module("tensorrt_llm.llmapi.utils")
        probe = getattr(utils, "enable_worker_single_process_for_tp1", None)
    cache_info = getattr(probe, "cache_info", None)
    already_read = cache_info is not None and cache_info().currsize > 0
    if not already_read:
        os.environ[SINGLE_PROCESS_ENV] = "1" if in_process else "0"
    effective = bool(probe()) if callable(probe) else in_process
    if effective != in_process:
        log.warning(
            "TRTLLM_IN_PROCESS=%d has no effect: TensorRT-LLM already read %s in this process and "
            "keeps the executor %s",
            in_process,
            SINGLE_PROCESS_ENV,
            "in this process" if effective else "in its worker process",
        )
    return effective


def sampling_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """Our sampling parameters as TensorRT-LLM `SamplingParams` keyword arguments.

    Greedy is `top_k=1` (TensorRT-LLM's own notion of greedy decoding) rather than temperature 0,
    which not every backend accepts. Stop strings are left out on purpose (see the module docstring).
    """
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "detokenize": True}
    if params.greedy:
        kwargs["top_k"] = 1
    else:
        kwargs["temperature"] = params.temperature
        kwargs["top_p"] = params.top_p
        if params.top_k > 0:
            kwargs["top_k"] = params.top_k
    if params.seed is not None:
        kwargs["seed"] = params.seed
    return kwargs


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@dataclass(slots=True, eq=False)
class _Request:
    request_id: str
    stream: EventStream
    output: Any  # tensorrt_llm RequestOutput
    prompt_tokens: int
    detok: IncrementalDetokenizer
    queued_at: float
    generated: int = 0
    responses: int = 0  # responses TensorRT-LLM has sent: 0 means it may still be queued
    first_token_at: float | None = None
    unsent_ids: list[int] = field(default_factory=list)
    aborted: bool = False  # abort() or shutdown: ends with cancelled
    abort_sent: bool = False  # RequestOutput.abort() was called
    stop_string: bool = False  # we ended it on a stop string
    task: asyncio.Task[None] | None = None


class TrtLlmEngine:
    """The engine contract on TensorRT-LLM's LLM API (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        if not tensorrt_llm_installed():
            raise TrtLlmUnavailableError(INSTALL_HINT)
        self._settings = settings
        self._model = settings.model_path or DEFAULT_MODEL
        self._context_size = settings.context_size
        self._trt: ModuleType | None = None
        self._llm: Any = None
        self._tokenizer: Any = None
        self._request_error: type[BaseException] = _NeverRaised
        self._accepting = False
        self._requests: dict[str, _Request] = {}  # streams not yet finished
        self._pumps: set[asyncio.Task[None]] = set()  # still following a TensorRT-LLM request
        self._tokens = 0
        self._finish_counts: Counter[str] = Counter()  # how TensorRT-LLM requests ended
        self._backend_stats: dict[str, float] = {}
        self._stats_task: asyncio.Task[None] | None = None
        self._submitted = False  # a request has been made: iteration stats exist
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_process: bool | None = None  # the worker mode in effect, once started
        self.sampler: str | None = None  # the sampler chosen, once started

    # -- the contract ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return Path(self._model).name or self._model

    @property
    def context_size(self) -> int:
        return self._context_size

    async def start(self) -> None:
        if self._llm is not None:
            return
        trt = import_tensorrt_llm()
        self._loop = asyncio.get_running_loop()
        sampler_kwargs, self.sampler = sampler_options(llm_arg_fields(trt))
        self.in_process = apply_worker_mode(self._settings.trtllm_in_process)
        kwargs: dict[str, Any] = {
            "max_seq_len": self._settings.context_size,
            "max_batch_size": self._settings.max_seqs,
            "enable_iter_perf_stats": True,
            **sampler_kwargs,
        }
        try:
            llm = await asyncio.to_thread(lambda: trt.LLM(model=self._model, **kwargs))
        except Exception as exc:
            raise EngineUnavailableError(
                f"TensorRT-LLM could not load {self._model}: {exc}"
            ) from exc
        if llm.tokenizer is None:
            await asyncio.to_thread(llm.shutdown)
            raise EngineUnavailableError(f"TensorRT-LLM loaded {self._model} without a tokenizer")
        self._trt, self._llm, self._tokenizer = trt, llm, llm.tokenizer
        self._request_error = request_error_type()
        limit = self._executor_max_seq_len(llm)
        if limit is not None and 0 < limit < self._context_size:
            self._context_size = limit
        backend = getattr(getattr(llm, "args", None), "backend", None) or "pytorch"
        log.info(
            "TensorRT-LLM %s: %s backend, %s, executor %s, max_seq_len %d, max_batch_size %d",
            getattr(trt, "__version__", "?"),
            backend,
            self.sampler,
            "in this process" if self.in_process else "in its worker process",
            self._context_size,
            self._settings.max_seqs,
        )
        self._accepting = True
        self._stats_task = asyncio.create_task(self._poll_stats(), name="trtllm-stats")

    @staticmethod
    def _executor_max_seq_len(llm: Any) -> int | None:
        """The limit the executor enforces: base_worker.py keeps the model engine's (possibly
        lower) `max_seq_len` on the in-process worker; otherwise the LLM's arguments."""
        for value in (
            getattr(getattr(llm, "_executor", None), "max_seq_len", None),
            getattr(getattr(llm, "args", None), "max_seq_len", None),
        ):
            if isinstance(value, int) and value > 0:
                return value
        return None

    async def shutdown(self) -> None:
        self._accepting = False
        requests = list(self._requests.values())
        for req in requests:
            self._cancel(req)
        answered = [r.task for r in requests if r.task is not None and r.responses]
        if answered:  # their final `cancelled` responses come at the next iteration
            await asyncio.wait(answered, timeout=ABORT_GRACE_S)
        pumps = list(self._pumps)  # the rest may never get a response: stop following them
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for req in requests:
            self._finish(req, FinishReason.CANCELLED)
        self._requests.clear()
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
            self._stats_task = None
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def generate(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        *,
        owner: str | None = None,  # unused: TensorRT-LLM's own scheduler admits requests
    ) -> EventStream:
        if not self._accepting or self._llm is None or self._trt is None:
            raise EngineUnavailableError("the TensorRT-LLM engine is not running")
        if request_id in self._requests:
            raise DuplicateRequestError(f"request {request_id!r} is already running")
        # Before anything reaches TensorRT-LLM: its result needs this loop (executor/result.py).
        loop = asyncio.get_running_loop()
        token_ids = self._tokenize(messages)
        if len(token_ids) + 1 > self._context_size:
            raise PromptTooLongError(len(token_ids), self._context_size)
        max_tokens = min(params.max_tokens, self._context_size - len(token_ids))
        try:
            trt_params = self._trt.SamplingParams(**sampling_kwargs(params, max_tokens))
            output = self._llm.generate_async(token_ids, trt_params, streaming=True)
        except Exception as exc:
            raise self._refusal(exc, len(token_ids)) from exc
        req = _Request(
            request_id=request_id,
            stream=EventStream(request_id, self.abort),
            output=output,
            prompt_tokens=len(token_ids),
            detok=IncrementalDetokenizer(stop=params.stop),
            queued_at=time.time(),
        )
        self._requests[request_id] = req
        self._submitted = True
        req.task = loop.create_task(self._pump(req), name=f"trtllm-{request_id}")
        self._pumps.add(req.task)
        req.task.add_done_callback(self._pumps.discard)
        return req.stream

    def abort(self, request_id: str) -> None:
        loop = self._loop
        if loop is None:
            return
        if not _on_loop(loop):  # from another thread: hop onto the loop, never block
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to abort
                loop.call_soon_threadsafe(self.abort, request_id)
            return
        req = self._requests.get(request_id)
        if req is None or req.aborted or req.stream.finished:
            return
        self._cancel(req)
        loop.call_later(ABORT_GRACE_S, self._abort_deadline, req)

    def stats(self) -> EngineStats:
        block = self._backend_stats.get("tokens_per_block", 0.0)
        extra: dict[str, float] = {
            f"trt_finish_{k}": float(v) for k, v in self._finish_counts.items()
        }
        if "iter_latency_ms" in self._backend_stats:
            extra["iter_latency_ms"] = self._backend_stats["iter_latency_ms"]
        if "active" in self._backend_stats:
            extra["trt_active_requests"] = self._backend_stats["active"]
        if "used_blocks" in self._backend_stats:
            extra["trt_kv_used_blocks"] = self._backend_stats["used_blocks"]
        if self.in_process is not None:
            extra["trt_in_process"] = float(self.in_process)
        return EngineStats(
            running=len(self._requests),
            waiting=int(self._backend_stats.get("queued", 0)),
            kv_used=int(self._backend_stats.get("used_blocks", 0) * block),
            kv_total=int(self._backend_stats.get("max_blocks", 0) * block),
            steps=int(self._backend_stats.get("iter", 0)),
            tokens_generated=self._tokens,
            extra=extra,
        )

    # -- per request ----------------------------------------------------------------------------

    def _tokenize(self, messages: ChatMessages) -> list[int]:
        if not messages:
            raise EngineError("no messages to answer")
        conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            prompt = self._tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True
            )
            return list(self._tokenizer.encode(prompt, add_special_tokens=False))
        except Exception as exc:  # template errors come as jinja2 / ValueError / KeyError
            raise EngineError(f"cannot render the chat template: {exc}") from exc

    def _refusal(self, exc: Exception, prompt_tokens: int) -> EngineError:
        """What `generate_async` raised, as our error: a shut-down LLM is unavailable; anything
        else is about this request (a 400)."""
        executor = getattr(self._llm, "_executor", None)
        shut_down = getattr(executor, "is_shutdown", None)
        if (callable(shut_down) and shut_down()) or "shutting down" in str(exc):
            self._accepting = False
            log.error("TensorRT-LLM has shut down: %r", exc)
            return EngineUnavailableError(f"TensorRT-LLM cannot take requests: {exc}")
        if isinstance(exc, (ValueError, TypeError, self._request_error)) and _NO_ROOM.search(
            str(exc)
        ):
            return PromptTooLongError(prompt_tokens, self._context_size)
        return EngineError(f"TensorRT-LLM refused the request: {exc}")

    async def _pump(self, req: _Request) -> None:
        """Follow one TensorRT-LLM request to its end, turning its outputs into our events."""
        trt_reason: str | None = None
        try:
            async for out in req.output:
                req.responses += 1
                completion = out.outputs[0]
                if out.finished:
                    trt_reason = completion.finish_reason
                if req.stream.finished or req.aborted:
                    continue  # ended on our side: drain until TensorRT-LLM lets go of it
                self._take(req, completion.token_ids_diff, completion.text_diff)
        except asyncio.CancelledError:
            self._finish(req, FinishReason.CANCELLED)
            raise
        except Exception as exc:
            log.warning("TensorRT-LLM request %s failed: %r", req.request_id, exc)
            self._finish(req, FinishReason.ERROR, error=f"TensorRT-LLM failed: {exc}")
        else:
            self._finish_backend(req, trt_reason)
        finally:
            outcome = "stop_string" if req.stop_string else trt_reason or "unconfirmed"
            self._finish_counts[outcome] += 1
            self._release(req)

    def _take(self, req: _Request, token_ids: list[int], text: str) -> None:
        if token_ids:
            req.generated += len(token_ids)
            self._tokens += len(token_ids)
            req.unsent_ids.extend(token_ids)
            if req.first_token_at is None:
                req.first_token_at = time.time()
        stable, stopped = req.detok.push(text) if text else ("", False)
        self._emit(req, stable)
        if stopped:
            req.stop_string = True
            self._finish(req, FinishReason.STOP)
            self._release(req)
            self._abort_backend(req)

    def _finish_backend(self, req: _Request, trt_reason: str | None) -> None:
        """TensorRT-LLM says the request is over: end our stream the way it ended."""
        if req.stream.finished:
            return
        if req.aborted:
            self._finish(req, FinishReason.CANCELLED)
            return
        reason = _FINISH_REASONS.get(trt_reason or "")
        if reason is None:
            error = "TensorRT-LLM timed out the request" if trt_reason == "timeout" else None
            error = error or f"TensorRT-LLM ended the request with finish_reason={trt_reason!r}"
            self._finish(req, FinishReason.ERROR, error=error)
            return
        if reason is not FinishReason.CANCELLED:
            self._emit(req, req.detok.flush())
        self._finish(req, reason)

    def _cancel(self, req: _Request) -> None:
        """Stop or shutdown: ask TensorRT-LLM to cancel; a request it never answered may be in its
        waiting queue, which drops it without a response, so it ends here and now."""
        req.aborted = True
        self._abort_backend(req)
        if req.responses == 0:
            self._finish(req, FinishReason.CANCELLED)
            self._release(req)

    def _release(self, req: _Request) -> None:
        if self._requests.get(req.request_id) is req:
            del self._requests[req.request_id]

    def _abort_backend(self, req: _Request) -> None:
        if req.abort_sent or req.output.finished:
            return
        req.abort_sent = True
        try:
            req.output.abort()
        except Exception as exc:  # the request may be ending on its own just now
            log.debug("RequestOutput.abort() for %s failed: %r", req.request_id, exc)

    def _abort_deadline(self, req: _Request) -> None:
        if not req.stream.finished:
            log.warning("TensorRT-LLM did not confirm abort of %s in time", req.request_id)
            self._finish(req, FinishReason.CANCELLED)
        if req.task is not None and not req.task.done():
            req.task.cancel()  # nothing more will come for it (a request dropped while queued)

    @staticmethod
    def _emit(req: _Request, text: str) -> None:
        if text:
            req.stream.push(TextDelta(text=text, token_ids=tuple(req.unsent_ids)))
            req.unsent_ids.clear()

    @staticmethod
    def _finish(req: _Request, reason: FinishReason, error: str | None = None) -> None:
        req.stream.push(
            Finished(
                reason=reason,
                prompt_tokens=req.prompt_tokens,
                completion_tokens=req.generated,
                queued_at=req.queued_at,
                first_token_at=req.first_token_at,
                finished_at=time.time(),
                error=error,
            )
        )

    # -- stats ----------------------------------------------------------------------------------

    async def _poll_stats(self) -> None:
        """Keep the latest iteration stats, polling for as long as the engine runs once a request
        has been made (TensorRT-LLM has none before): the last iterations before the executor goes
        idle are the ones that show the queue and the KV cache emptied."""
        while True:
            await asyncio.sleep(STATS_POLL_S)
            if self._llm is None or not self._submitted:
                continue
            try:
                async for stat in self._llm.get_stats_async(timeout=STATS_POLL_S):
                    self._record_stats(json.loads(stat) if isinstance(stat, str) else stat)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("TensorRT-LLM iteration stats unavailable, reporting 0s: %r", exc)
                return

    def _record_stats(self, stat: dict[str, Any]) -> None:
        kv = stat.get("kvCacheStats") or {}
        fields = {
            "iter": stat.get("iter"),
            "iter_latency_ms": stat.get("iterLatencyMS"),
            "active": stat.get("numActiveRequests"),
            "queued": stat.get("numQueuedRequests"),
            "used_blocks": kv.get("usedNumBlocks"),
            "max_blocks": kv.get("maxNumBlocks"),
            "tokens_per_block": kv.get("tokensPerBlock"),
        }
        self._backend_stats.update({k: float(v) for k, v in fields.items() if v is not None})
