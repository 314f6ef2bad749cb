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
  for, against the limits TensorRT-LLM really enforces (`limits`: the model engine may lower
  `max_seq_len`; without chunked prefill a prompt may not pass `max_num_tokens`). A prompt over
  them is refused here, with the real limit. A reply cut by the context ends with `length`;
- admission is ours, fair across owners (app/engine/fair_queue.py, as on the other engines): at
  most `max_batch_size` requests are in TensorRT-LLM at once, whose own queue is first come first
  served (py_executor.py); the rest wait here, and the next one in goes to the owner with the
  fewest running. A request is handed to `generate_async` when it is admitted, at once when a
  slot is free, so that what TensorRT-LLM refuses on the spot is a 400;
- with a worker process, what the worker refuses comes back on the request's stream (executor/
  worker.py `worker_main` sends an `ErrorResponse`; result.py raises it as `RequestError`): an
  error before the first token is a refusal (the reply ends `error` saying why, with the real limit
  where it is one, learnt for later requests), after it a failure (`error`, the text so far kept);
- each request is salted with its owner where `generate_async` takes `cache_salt`, and block reuse
  is off where it does not (`setup.cache_options`): no owner gets a faster first token from
  another's prompt;
- stop strings stay ours: `IncrementalDetokenizer` holds back a possible stop-string prefix exactly
  as on the CPU engines; on a stop string the reply ends with `stop` and the TensorRT-LLM request is
  aborted;
- Stop: `RequestOutput.abort()`. A request TensorRT-LLM has already answered ends with the final
  `cancelled` response it sends at its next iteration (ABORT_GRACE_S at the latest). One it has not
  answered yet may still sit in the executor's waiting queue, and such a request is dropped with
  no response at all (_torch/pyexecutor/py_executor.py `_handle_canceled_requests` ->
  `update_waiting_queue`): it ends `cancelled` at once, with no tokens, and whatever TensorRT-LLM
  still sends for it is drained and ignored. One still waiting here just leaves the queue;
- a dead executor (the worker process killed, a CUDA fault: `watch`) leaves its requests without
  a final response forever: the engine looks every WATCH_S, ends every open reply `error` (their
  text is kept by the layers above), reports itself unavailable (`stats().unavailable`, so
  /readyz answers 503 with the reason) and builds a new LLM, retrying with backoff;
- refusals become `EngineError` / `PromptTooLongError` (a 400), a shut-down LLM
  `EngineUnavailableError` (see `errors`).

`kv_cells` and the step settings (`step_stretch`, `max_step_tokens`) do not apply (TensorRT-LLM
sizes its KV cache from free GPU memory and schedules tokens itself); `max_seqs` becomes
`max_batch_size`, `context_size` `max_seq_len`. `stats()`: `running` is our requests in flight,
`waiting` those queued here and in TensorRT-LLM; KV use comes from TensorRT-LLM's iteration
stats (see `stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter
from collections.abc import Mapping
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
from app.engine.fair_queue import FairQueue
from app.engine.requests import RequestState, TableEngine, reply_room
from app.engine.token_counting import MessageCounter
from app.engine.trtllm.errors import NeverRaised, backend_ending, refusal, request_error_type
from app.engine.trtllm.limits import Limits, read_limits
from app.engine.trtllm.setup import (
    DEFAULT_MODEL,
    INSTALL_HINT,
    TrtLlmUnavailableError,
    apply_worker_mode,
    cache_options,
    import_tensorrt_llm,
    llm_arg_fields,
    sampler_options,
    sampling_kwargs,
    tensorrt_llm_installed,
    version_tuple,
)
from app.engine.trtllm.stats import IterationStats
from app.engine.trtllm.watch import WATCH_S, executor_failure
from app.settings import EngineSettings

log = logging.getLogger(__name__)

ABORT_GRACE_S = 5.0  # an aborted request ends by then even if TensorRT-LLM never confirms it
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between attempts to rebuild a dead LLM


@dataclass(slots=True, eq=False)
class _Request(RequestState):
    token_ids: list[int] | None = None  # the prompt, until handed to TensorRT-LLM
    trt_params: Any = None  # its tensorrt_llm SamplingParams
    output: Any = None  # its tensorrt_llm RequestOutput, once handed over
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
        asked = settings.context_size or settings.kv_cells  # until the model config says
        self._limits = Limits(asked, asked)
        self._counter: MessageCounter | None = None
        self._trt: ModuleType | None = None
        self._llm: Any = None
        self._llm_kwargs: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._request_error: type[BaseException] = NeverRaised  # until started
        self._salted = False  # requests carry their owner as `cache_salt`
        self._accepting = False
        self._failure: str | None = None  # the executor died: why (a new LLM is being built)
        self._waiting: FairQueue[_Request] = FairQueue(lambda r: r.owner)
        self._in_trt: set[_Request] = set()  # handed to TensorRT-LLM and still followed
        self._tokens = 0
        self._finish_counts: Counter[str] = Counter()  # how TensorRT-LLM requests ended
        self._iteration_stats = IterationStats()
        self._background: list[asyncio.Task[None]] = []  # stats polling, the executor watch
        self.in_process: bool | None = None  # the worker mode in effect, once started
        self.sampler: str | None = None  # the sampler chosen, once started

    # -- the contract ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return Path(self._model).name or self._model

    @property
    def context_size(self) -> int:
        return self._limits.context

    def count_tokens(self, message: Mapping[str, str]) -> int:
        if self._counter is None:
            raise EngineUnavailableError("the TensorRT-LLM engine is not running")
        return self._counter.count(message)

    @property
    def prompt_overhead(self) -> int:
        return 0 if self._counter is None else self._counter.overhead

    async def start(self) -> None:
        if self._llm is not None:
            return
        trt = import_tensorrt_llm()
        self._loop = asyncio.get_running_loop()
        fields = llm_arg_fields(trt)
        version = getattr(trt, "__version__", "?")
        choice = sampler_options(version_tuple(str(version)), fields)
        cache_kwargs, self._salted = cache_options(trt)
        self.sampler = choice.name
        self.in_process = apply_worker_mode(self._settings.trtllm_in_process)
        # ENGINE_CONTEXT 0 (the default): no max_seq_len, so TensorRT-LLM takes the model
        # config's positions, lowered to what its KV cache holds (read back by `read_limits`)
        asked = self._settings.context_size
        self._llm_kwargs = {
            **({"max_seq_len": asked} if asked else {}),
            "max_batch_size": self._settings.max_seqs,
            "enable_iter_perf_stats": True,
            **({"enable_chunked_prefill": True} if "enable_chunked_prefill" in fields else {}),
            **choice.kwargs,
            **cache_kwargs,
        }
        self._trt = trt
        await self._build()
        self._request_error = request_error_type()
        log.info(
            "TensorRT-LLM %s: %s backend, %s (ignores: %s), executor %s, max_seq_len %d, "
            "prompt limit %d, max_batch_size %d, prefix cache %s",
            version,
            getattr(self._llm.args, "backend", None) or "pytorch",
            choice.name,
            ", ".join(choice.ignored) or "nothing",
            "in this process" if self.in_process else "in its worker process",
            self._limits.context,
            self._limits.prompt,
            self._settings.max_seqs,
            "salted per owner" if self._salted else "off (no cache_salt in this release)",
        )
        for field in choice.ignored:
            log.warning("TensorRT-LLM %s's %s ignores `%s`", version, choice.name, field)
        self._accepting = True
        self._background = [
            asyncio.create_task(self._iteration_stats.poll(lambda: self._llm), name="trtllm-stats"),
            asyncio.create_task(self._watch(), name="trtllm-watch"),
        ]

    async def _build(self) -> None:
        """Build the LLM (off the loop: it loads the model) and read what it enforces."""
        assert self._trt is not None
        trt, kwargs = self._trt, self._llm_kwargs
        try:
            llm = await asyncio.to_thread(lambda: trt.LLM(model=self._model, **kwargs))
        except Exception as exc:
            raise EngineUnavailableError(
                f"TensorRT-LLM could not load {self._model}: {exc}"
            ) from exc
        if llm.tokenizer is None:
            await asyncio.to_thread(llm.shutdown)
            raise EngineUnavailableError(f"TensorRT-LLM loaded {self._model} without a tokenizer")
        self._llm, self._tokenizer = llm, llm.tokenizer
        self._limits = read_limits(llm, self._settings.context_size)
        tokenizer = llm.tokenizer
        self._counter = MessageCounter(
            lambda messages, opener: tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=opener
            ),
            lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
        )

    async def shutdown(self) -> None:
        self._accepting = False
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        requests = list(self.requests)
        for req in requests:
            self._cancel(req)
        answered = [r.task for r in requests if r.task is not None and r.responses]
        if answered:  # their final `cancelled` responses come at the next iteration
            await asyncio.wait(answered, timeout=ABORT_GRACE_S)
        await self._stop_following()
        for req in requests:
            req.finish(FinishReason.CANCELLED)
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def _unavailable(self) -> str | None:
        if self._failure is not None:
            return self._failure
        if not self._accepting or self._llm is None or self._trt is None:
            return "the TensorRT-LLM engine is not running"
        return None

    def _open(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        owner: str | None,
    ) -> _Request:
        assert self._trt is not None
        # Before anything reaches TensorRT-LLM: its result needs this loop (executor/result.py).
        asyncio.get_running_loop()
        token_ids = self._tokenize(messages)
        self._limits.check_prompt(len(token_ids))
        max_tokens = reply_room(len(token_ids), self._limits.context, params)
        req = _Request(
            request_id=request_id,
            prompt_tokens=len(token_ids),
            detok=IncrementalDetokenizer(stop=params.stop),
            owner=owner,
            token_ids=token_ids,
            trt_params=self._trt.SamplingParams(**sampling_kwargs(params, max_tokens)),
        )
        if self._slot_free():  # handed over now, so that a refusal on the spot is a 400
            req.output = self._hand_over(req)
        return req

    def _submit(self, req: _Request) -> None:
        self._waiting.append(req)
        if req.output is not None:  # a slot was free: nobody waits, so it is the one due
            assert self._waiting.pop() is req
            self._follow(req)

    def _abort(self, req: _Request) -> None:
        assert self._loop is not None
        self._cancel(req)
        if not req.done:
            self._loop.call_later(ABORT_GRACE_S, self._abort_deadline, req)

    def stats(self) -> EngineStats:
        extra = {f"trt_finish_{k}": float(v) for k, v in self._finish_counts.items()}
        if self.in_process is not None:
            extra["trt_in_process"] = float(self.in_process)
        return self._iteration_stats.engine_stats(
            running=len(self.requests) - len(self._waiting),
            waiting=len(self._waiting),
            idle=not self._in_trt,
            tokens=self._tokens,
            extra=extra,
            unavailable=self._failure,
        )

    # -- admission ------------------------------------------------------------------------------

    def _slot_free(self) -> bool:
        return not self._waiting and len(self._in_trt) < self._settings.max_seqs

    def _hand_over(self, req: _Request) -> Any:
        """`generate_async` for `req`; what TensorRT-LLM refuses on the spot raises our error."""
        kwargs = {"cache_salt": req.owner} if self._salted else {}
        try:
            return self._llm.generate_async(req.token_ids, req.trt_params, streaming=True, **kwargs)
        except Exception as exc:
            error = self._limits.learn(str(exc), req.prompt_tokens) or refusal(
                exc, self._llm, self._request_error, req.prompt_tokens, self._limits.context
            )
            if isinstance(error, EngineUnavailableError):
                log.error("TensorRT-LLM has shut down: %r", exc)
            raise error from exc

    def _follow(self, req: _Request) -> None:
        assert self._loop is not None
        req.token_ids = None  # TensorRT-LLM has it now
        req.admitted_at = time.time()
        self._in_trt.add(req)
        self._iteration_stats.requested = True
        req.task = self._loop.create_task(self._pump(req), name=f"trtllm-{req.request_id}")

    def _admit(self) -> None:
        """Fill the free slots from the fair queue."""
        while self._waiting and len(self._in_trt) < self._settings.max_seqs:
            if self._unavailable():
                return
            req = self._waiting.pop()
            try:
                req.output = self._hand_over(req)
            except EngineError as exc:
                self._waiting.done(req)
                self._finish_counts["refused"] += 1
                req.finish(FinishReason.ERROR, str(exc))
                continue
            self._follow(req)

    def _release(self, req: _Request) -> None:
        """TensorRT-LLM lets go of `req`: its slot goes to the next one due."""
        if req in self._in_trt:
            self._in_trt.discard(req)
            self._waiting.done(req)
            self._admit()

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
            trt_reason = self._failed(req, exc)
        else:
            self._finish_backend(req, trt_reason)
        finally:
            outcome = "stop_string" if req.stop_string else trt_reason or "unconfirmed"
            self._finish_counts[outcome] += 1
            self._release(req)

    def _failed(self, req: _Request, exc: Exception) -> str:
        """The request's stream raised (an `ErrorResponse`, result.py): before its first token
        a refusal, with the real limit where it is one; after it a failure."""
        if req.first_token_at is None and not req.aborted:
            error = self._limits.learn(str(exc), req.prompt_tokens)
            log.info("TensorRT-LLM refused request %s: %s", req.request_id, exc)
            req.finish(FinishReason.ERROR, str(error or f"TensorRT-LLM refused the request: {exc}"))
            return "refused"
        log.warning("TensorRT-LLM request %s failed: %r", req.request_id, exc)
        req.finish(FinishReason.ERROR, f"TensorRT-LLM failed: {exc}")
        return "error"

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
        """Stop or shutdown. One waiting here leaves the queue. Otherwise ask TensorRT-LLM to
        cancel; a request it never answered may be in its waiting queue, which drops it without
        a response, so it ends here and now."""
        req.aborted = True
        if req in self._waiting:
            self._waiting.remove(req)
            req.finish(FinishReason.CANCELLED)
            return
        self._abort_backend(req)
        if req.responses == 0:
            req.finish(FinishReason.CANCELLED)

    def _abort_backend(self, req: _Request) -> None:
        if req.output is None or req.abort_sent or req.output.finished:
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

    # -- a dead executor ------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Look at the executor every WATCH_S; when it has died, fail what it held and build a
        new LLM (see `watch`)."""
        while True:
            await asyncio.sleep(WATCH_S)
            if self._failure is None and (why := executor_failure(self._llm)):
                await self._recover(why)

    async def _recover(self, why: str) -> None:
        self._failure = f"{why}; restarting TensorRT-LLM"
        log.error("%s: ending %d replies with an error", self._failure, len(self.requests))
        for req in list(self.requests):
            req.finish(FinishReason.ERROR, f"the inference engine failed: {why}")
        self._waiting.clear()
        await self._stop_following()
        old, self._llm = self._llm, None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(old.shutdown), timeout=30)
        for attempt in itertools.count():
            try:
                await self._build()
            except EngineUnavailableError as exc:
                delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
                self._failure = (
                    f"{why}; restarting TensorRT-LLM failed ({exc}), next try in {delay:g} s"
                )
                log.error("%s", self._failure)
                await asyncio.sleep(delay)
                continue
            break
        self._failure = None
        log.warning("TensorRT-LLM restarted after: %s", why)

    async def _stop_following(self) -> None:
        """Stop following every TensorRT-LLM request (they may never get a response)."""
        tasks = [r.task for r in self._in_trt if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._in_trt.clear()
