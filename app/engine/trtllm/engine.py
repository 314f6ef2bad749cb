"""TensorRT-LLM (>= 1.0, PyTorch backend) behind the engine contract, through its LLM API.

TensorRT-LLM batches, schedules and manages the KV cache itself; this adapter turns its per-request
async streams into our events. What it relies on was read in NVIDIA/TensorRT-LLM's sources (1.0
and the newer releases; paths relative to `tensorrt_llm/`), cited where it is used; finding and
configuring TensorRT-LLM (version, sampler, worker process) is `setup`, what its refusals and
endings mean here `errors`, its iteration stats `stats`.

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
- refusals become `EngineError` / `PromptTooLongError` (a 400), a shut-down LLM
  `EngineUnavailableError` (see `errors`).

`kv_cells` and the step settings (`step_stretch`, `max_step_tokens`) do not apply (TensorRT-LLM
sizes its KV cache from free GPU memory and schedules tokens itself); `max_seqs` becomes
`max_batch_size`, `context_size`
`max_seq_len`. `stats()`: `running` is our requests in flight; queue depth and KV use come from
TensorRT-LLM's iteration stats (see `stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from app.engine.base import (
    ChatMessages,
    EngineError,
    EngineStats,
    EngineUnavailableError,
    FinishReason,
    SamplingParams,
)
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.requests import RequestState, TableEngine, reply_room
from app.engine.trtllm.errors import NeverRaised, backend_ending, refusal, request_error_type
from app.engine.trtllm.setup import (
    DEFAULT_MODEL,
    INSTALL_HINT,
    TrtLlmUnavailableError,
    apply_worker_mode,
    executor_max_seq_len,
    import_tensorrt_llm,
    llm_arg_fields,
    sampler_options,
    sampling_kwargs,
    tensorrt_llm_installed,
)
from app.engine.trtllm.stats import IterationStats
from app.settings import EngineSettings

log = logging.getLogger(__name__)

ABORT_GRACE_S = 5.0  # an aborted request ends by then even if TensorRT-LLM never confirms it


@dataclass(slots=True, eq=False)
class _Request(RequestState):
    output: Any  # tensorrt_llm RequestOutput
    responses: int = 0  # responses TensorRT-LLM has sent: 0 means it may still be queued
    abort_sent: bool = False  # RequestOutput.abort() was called
    stop_string: bool = False  # we ended it on a stop string
    task: asyncio.Task[None] | None = None


class TrtLlmEngine(TableEngine[_Request]):
    """The engine contract on TensorRT-LLM's LLM API (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        if not tensorrt_llm_installed():
            raise TrtLlmUnavailableError(INSTALL_HINT)
        super().__init__()
        self._settings = settings
        self._model = settings.model_path or DEFAULT_MODEL
        self._context_size = settings.context_size
        self._trt: ModuleType | None = None
        self._llm: Any = None
        self._tokenizer: Any = None
        self._request_error: type[BaseException] = NeverRaised  # until started
        self._accepting = False
        self._pumps: set[asyncio.Task[None]] = set()  # still following a TensorRT-LLM request
        self._tokens = 0
        self._finish_counts: Counter[str] = Counter()  # how TensorRT-LLM requests ended
        self._iteration_stats = IterationStats()
        self._stats_task: asyncio.Task[None] | None = None
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
        limit = executor_max_seq_len(llm)
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
        self._stats_task = asyncio.create_task(self._iteration_stats.poll(llm), name="trtllm-stats")

    async def shutdown(self) -> None:
        self._accepting = False
        requests = list(self.requests)
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
            req.finish(FinishReason.CANCELLED)
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
            self._stats_task = None
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def _unavailable(self) -> str | None:
        if not self._accepting or self._llm is None or self._trt is None:
            return "the TensorRT-LLM engine is not running"
        return None

    def _open(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        owner: str | None,  # unused: TensorRT-LLM's own scheduler admits requests
    ) -> _Request:
        assert self._trt is not None
        # Before anything reaches TensorRT-LLM: its result needs this loop (executor/result.py).
        asyncio.get_running_loop()
        token_ids = self._tokenize(messages)
        max_tokens = reply_room(len(token_ids), self._context_size, params)
        try:
            trt_params = self._trt.SamplingParams(**sampling_kwargs(params, max_tokens))
            output = self._llm.generate_async(token_ids, trt_params, streaming=True)
        except Exception as exc:
            error = refusal(exc, self._llm, self._request_error, len(token_ids), self._context_size)
            if isinstance(error, EngineUnavailableError):
                self._accepting = False
                log.error("TensorRT-LLM has shut down: %r", exc)
            raise error from exc
        return _Request(
            request_id=request_id,
            output=output,
            prompt_tokens=len(token_ids),
            detok=IncrementalDetokenizer(stop=params.stop),
        )

    def _submit(self, req: _Request) -> None:
        assert self._loop is not None
        self._iteration_stats.requested = True
        req.task = self._loop.create_task(self._pump(req), name=f"trtllm-{req.request_id}")
        self._pumps.add(req.task)
        req.task.add_done_callback(self._pumps.discard)

    def _abort(self, req: _Request) -> None:
        assert self._loop is not None
        self._cancel(req)
        self._loop.call_later(ABORT_GRACE_S, self._abort_deadline, req)

    def stats(self) -> EngineStats:
        extra = {f"trt_finish_{k}": float(v) for k, v in self._finish_counts.items()}
        if self.in_process is not None:
            extra["trt_in_process"] = float(self.in_process)
        return self._iteration_stats.engine_stats(len(self.requests), self._tokens, extra)

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
                req.responses += 1
                completion = out.outputs[0]
                if out.finished:
                    trt_reason = completion.finish_reason
                if req.done or req.aborted:
                    continue  # ended on our side: drain until TensorRT-LLM lets go of it
                self._take(req, completion.token_ids_diff, completion.text_diff)
        except asyncio.CancelledError:
            req.finish(FinishReason.CANCELLED)
            raise
        except Exception as exc:
            log.warning("TensorRT-LLM request %s failed: %r", req.request_id, exc)
            req.finish(FinishReason.ERROR, f"TensorRT-LLM failed: {exc}")
        else:
            self._finish_backend(req, trt_reason)
        finally:
            outcome = "stop_string" if req.stop_string else trt_reason or "unconfirmed"
            self._finish_counts[outcome] += 1

    def _take(self, req: _Request, token_ids: list[int], text: str) -> None:
        self._tokens += len(token_ids)
        if req.tokens(token_ids, text, time.time()):  # a stop string
            req.stop_string = True
            req.finish(FinishReason.STOP)
            self._abort_backend(req)

    @staticmethod
    def _finish_backend(req: _Request, trt_reason: str | None) -> None:
        """TensorRT-LLM says the request is over: end our stream the way it ended."""
        if req.aborted:
            req.finish(FinishReason.CANCELLED)
        else:
            req.finish(*backend_ending(trt_reason))

    def _cancel(self, req: _Request) -> None:
        """Stop or shutdown: ask TensorRT-LLM to cancel; a request it never answered may be in its
        waiting queue, which drops it without a response, so it ends here and now."""
        req.aborted = True
        self._abort_backend(req)
        if req.responses == 0:
            req.finish(FinishReason.CANCELLED)

    def _abort_backend(self, req: _Request) -> None:
        if req.abort_sent or req.output.finished:
            return
        req.abort_sent = True
        try:
            req.output.abort()
        except Exception as exc:  # the request may be ending on its own just now
            log.debug("RequestOutput.abort() for %s failed: %r", req.request_id, exc)

    def _abort_deadline(self, req: _Request) -> None:
        if not req.done:
            log.warning("TensorRT-LLM did not confirm abort of %s in time", req.request_id)
            req.finish(FinishReason.CANCELLED)
        if req.task is not None and not req.task.done():
            req.task.cancel()  # nothing more will come for it (a request dropped while queued)
