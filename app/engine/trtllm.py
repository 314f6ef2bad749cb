"""TensorRT-LLM behind the engine contract, through its LLM API (`tensorrt_llm.LLM`).

TensorRT-LLM does the batching, scheduling and KV-cache management itself; this adapter only turns
its per-request async streams into our events. Per request:

- the prompt is the model's chat template (`llm.tokenizer.apply_chat_template(..., tokenize=False,
  add_generation_prompt=True)`), tokenised once here with `add_special_tokens=False` (the template
  already holds BOS and friends) for the context check; those token ids are what we hand to
  `llm.generate_async`, so TensorRT-LLM neither re-tokenises nor adds a second BOS, and our
  `prompt_tokens` is exactly what the model sees;
- `generate_async(ids, SamplingParams(...), streaming=True)` is called from the running event loop
  (its result queue binds to that loop) and iterated with `async for` by one task per request;
- `SamplingParams.max_tokens` defaults to 32 in TensorRT-LLM, so it is always set: the request's
  `max_tokens`, cut to what the context has room for;
- stop strings are not given to TensorRT-LLM: our `IncrementalDetokenizer` runs on `text_diff` and
  holds back a possible stop-string prefix exactly as the CPU engine does; when it hits a stop
  string the reply ends with `stop` at once and the TensorRT-LLM request is ended with
  `RequestOutput.abort()`;
- `abort()` calls `RequestOutput.abort()`; the stream ends with `cancelled` when TensorRT-LLM
  reports the request finished (normally its next iteration), or after `ABORT_GRACE_S` at the latest.

Worker process or not (`EngineSettings.trtllm_in_process`, env TRTLLM_IN_PROCESS): with a single GPU
the LLM API normally runs the executor in a spawned worker process and ships every response back
over IPC. With `trtllm_in_process` (the default) we set `TLLM_WORKER_USE_SINGLE_PROCESS=1` before
building the `LLM`, and the executor runs in this process:

- in-process: no IPC hop per token (lower, steadier inter-token latency), one process to deploy
  and watch; but the executor's threads share this interpreter (GIL contention with the web
  server under load) and a CUDA fault or executor crash takes the whole server down;
- worker process: the GPU work is isolated (a crash kills the worker, not the server, and the GIL
  is not shared), at the cost of serialisation and an IPC hop for every streamed response.

TensorRT-LLM reads the variable once per process (it caches the answer), so the setting of the first
engine started in a process wins; with tensor parallelism > 1 it always uses worker processes.

`kv_cells` and `step_token_budget` do not apply: TensorRT-LLM sizes its KV cache from free GPU
memory and schedules tokens itself. `max_seqs` becomes `max_batch_size`, `context_size` becomes
`max_seq_len`. `stats()` reports our in-flight requests as `running`; queue depth and KV use come
from TensorRT-LLM's iteration stats (`llm.get_stats_async`) when it provides them, else 0.

`tensorrt_llm` is imported only when the engine starts (it pulls in torch and CUDA); where it is not
installed, selecting this engine fails at once with `TrtLlmUnavailableError`, which says how to
install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import os
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


class TrtLlmUnavailableError(EngineUnavailableError):
    """`tensorrt_llm` cannot be imported on this machine."""


def tensorrt_llm_installed() -> bool:
    """Whether `tensorrt_llm` could be imported, without importing it (that costs seconds)."""
    if "tensorrt_llm" in sys.modules:
        return sys.modules["tensorrt_llm"] is not None
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


def import_tensorrt_llm() -> ModuleType:
    """Import `tensorrt_llm`, turning every way that fails into one clear error."""
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtLlmUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    except (OSError, RuntimeError) as exc:  # installed, but CUDA or a shared library is missing
        raise TrtLlmUnavailableError(
            f"tensorrt_llm is installed but failed to import: {exc}. It needs an NVIDIA GPU, "
            f"its CUDA runtime and a matching torch; see NVIDIA's TensorRT-LLM installation guide."
        ) from exc


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
    first_token_at: float | None = None
    unsent_ids: list[int] = field(default_factory=list)
    aborted: bool = False  # abort() or shutdown: ends with cancelled
    abort_sent: bool = False  # RequestOutput.abort() was called
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
        self._accepting = False
        self._requests: dict[str, _Request] = {}
        self._tokens = 0
        self._finish_counts: Counter[str] = Counter()  # TensorRT-LLM's own finish reasons
        self._backend_stats: dict[str, float] = {}
        self._stats_task: asyncio.Task[None] | None = None
        self._submitted = False  # a request went in since the last stats poll
        self._iter_stats = False  # the LLM was built with enable_iter_perf_stats
        self._loop: asyncio.AbstractEventLoop | None = None

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
        os.environ[SINGLE_PROCESS_ENV] = "1" if self._settings.trtllm_in_process else "0"
        kwargs: dict[str, Any] = {
            "max_seq_len": self._settings.context_size,
            "max_batch_size": self._settings.max_seqs,
        }
        try:
            llm = await asyncio.to_thread(self._build_llm, trt, kwargs)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineUnavailableError(
                f"TensorRT-LLM could not load {self._model}: {exc}"
            ) from exc
        if llm.tokenizer is None:
            await asyncio.to_thread(llm.shutdown)
            raise EngineUnavailableError(f"TensorRT-LLM loaded {self._model} without a tokenizer")
        self._trt, self._llm, self._tokenizer = trt, llm, llm.tokenizer
        max_seq_len = getattr(getattr(llm, "args", None), "max_seq_len", None)
        if isinstance(max_seq_len, int) and 0 < max_seq_len < self._context_size:
            self._context_size = max_seq_len
        self._accepting = True
        if self._iter_stats:  # without them every poll would only log "not available yet"
            self._stats_task = asyncio.create_task(self._poll_stats(), name="trtllm-stats")

    def _build_llm(self, trt: ModuleType, kwargs: dict[str, Any]) -> Any:
        """Blocking (minutes on a first build): runs in a thread. Asks for iteration stats, and
        builds without them on a TensorRT-LLM version that does not know that argument."""
        try:
            llm = trt.LLM(model=self._model, enable_iter_perf_stats=True, **kwargs)
        except (TypeError, ValueError) as exc:
            if "enable_iter_perf_stats" not in str(exc):
                raise
            return trt.LLM(model=self._model, **kwargs)
        self._iter_stats = True
        return llm

    async def shutdown(self) -> None:
        self._accepting = False
        requests = list(self._requests.values())
        for req in requests:
            req.aborted = True
            self._abort_backend(req)
        tasks = [r.task for r in requests if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=ABORT_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for req in requests:  # pumps that were cancelled, or never ran
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
        self, request_id: str, messages: ChatMessages, params: SamplingParams
    ) -> EventStream:
        if not self._accepting or self._llm is None or self._trt is None:
            raise EngineUnavailableError("the TensorRT-LLM engine is not running")
        if request_id in self._requests:
            raise DuplicateRequestError(f"request {request_id!r} is already running")
        token_ids = self._tokenize(messages)
        if len(token_ids) + 1 > self._context_size:
            raise PromptTooLongError(len(token_ids), self._context_size)
        max_tokens = min(params.max_tokens, self._context_size - len(token_ids))
        trt_params = self._trt.SamplingParams(**sampling_kwargs(params, max_tokens))
        try:
            output = self._llm.generate_async(token_ids, trt_params, streaming=True)
        except (ValueError, TypeError) as exc:
            raise EngineError(f"TensorRT-LLM refused the request: {exc}") from exc
        except RuntimeError as exc:  # "LLM is shutting down" and the like
            raise EngineUnavailableError(f"TensorRT-LLM cannot take requests: {exc}") from exc
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
        req.task = asyncio.get_running_loop().create_task(
            self._pump(req), name=f"trtllm-{request_id}"
        )
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
        req.aborted = True
        self._abort_backend(req)
        loop.call_later(ABORT_GRACE_S, self._abort_deadline, req)

    def stats(self) -> EngineStats:
        block = self._backend_stats.get("tokens_per_block", 0.0)
        extra: dict[str, float] = {
            f"trt_finish_{k}": float(v) for k, v in self._finish_counts.items()
        }
        if "iter_latency_ms" in self._backend_stats:
            extra["iter_latency_ms"] = self._backend_stats["iter_latency_ms"]
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

    async def _pump(self, req: _Request) -> None:
        """Follow one TensorRT-LLM request to its end, turning its outputs into our events."""
        trt_reason: str | None = None
        try:
            async for out in req.output:
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
            self._finish_counts[trt_reason or "none"] += 1
            self._requests.pop(req.request_id, None)

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
            self._finish(req, FinishReason.STOP)
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
        """Keep the latest iteration stats; best effort: a TensorRT-LLM without them gives 0s."""
        while True:
            await asyncio.sleep(STATS_POLL_S)
            if self._llm is None or not (self._requests or self._submitted):
                continue  # TensorRT-LLM has no stats before the first request
            self._submitted = False
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
            "queued": stat.get("numQueuedRequests"),
            "used_blocks": kv.get("usedNumBlocks"),
            "max_blocks": kv.get("maxNumBlocks"),
            "tokens_per_block": kv.get("tokensPerBlock"),
        }
        self._backend_stats.update({k: float(v) for k, v in fields.items() if v is not None})
