"""TensorRT-LLM's LLM API behind the engine contract: what the adapter relies on, and why, is the
package's docstring (app/engine/trtllm/__init__.py), with the sources it was read in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
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
from app.engine.requests import TableEngine, reply_room
from app.engine.token_counting import MessageCounter
from app.engine.trtllm.errors import NeverRaised, refusal, request_error_type
from app.engine.trtllm.limits import Limits, read_limits
from app.engine.trtllm.request import TrtRequest
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
from app.engine.trtllm.template import message_counter, prompt_ids
from app.engine.trtllm.watch import WATCH_S, executor_failure, rebuild
from app.settings import EngineSettings

log = logging.getLogger(__name__)

ABORT_GRACE_S = 5.0  # an aborted request ends by then even if TensorRT-LLM never confirms it


class TrtLlmEngine(TableEngine[TrtRequest]):
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
        self._waiting: FairQueue[TrtRequest] = FairQueue(lambda r: r.owner)
        self._in_trt: set[TrtRequest] = set()  # handed to TensorRT-LLM and still followed
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
        self._counter = message_counter(llm.tokenizer)

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
    ) -> TrtRequest:
        assert self._trt is not None
        # Before anything reaches TensorRT-LLM: its result needs this loop (executor/result.py).
        asyncio.get_running_loop()
        token_ids = prompt_ids(self._tokenizer, messages)
        self._limits.check_prompt(len(token_ids))
        max_tokens = reply_room(len(token_ids), self._limits.context, params)
        req = TrtRequest(
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

    def _submit(self, req: TrtRequest) -> None:
        self._waiting.append(req)
        if req.output is not None:  # a slot was free: nobody waits, so it is the one due
            assert self._waiting.pop() is req
            self._follow(req)

    def _abort(self, req: TrtRequest) -> None:
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

    def _hand_over(self, req: TrtRequest) -> Any:
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

    def _follow(self, req: TrtRequest) -> None:
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

    def _release(self, req: TrtRequest) -> None:
        """TensorRT-LLM lets go of `req`: its slot goes to the next one due."""
        if req in self._in_trt:
            self._in_trt.discard(req)
            self._waiting.done(req)
            self._admit()

    # -- per request ----------------------------------------------------------------------------

    async def _pump(self, req: TrtRequest) -> None:
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
            req.end_as_backend_said(trt_reason)
        finally:
            outcome = "stop_string" if req.stop_string else trt_reason or "unconfirmed"
            self._finish_counts[outcome] += 1
            self._release(req)

    def _failed(self, req: TrtRequest, exc: Exception) -> str:
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

    def _take(self, req: TrtRequest, token_ids: list[int], text: str) -> None:
        self._tokens += len(token_ids)
        if req.tokens(token_ids, text, time.time()):  # a stop string
            req.stop_string = True
            req.finish(FinishReason.STOP)
            req.abort_backend()

    def _cancel(self, req: TrtRequest) -> None:
        """Stop or shutdown. One waiting here leaves the queue. Otherwise ask TensorRT-LLM to
        cancel; a request it never answered may be in its waiting queue, which drops it without
        a response, so it ends here and now."""
        req.aborted = True
        if req in self._waiting:
            self._waiting.remove(req)
            req.finish(FinishReason.CANCELLED)
            return
        req.abort_backend()
        if req.responses == 0:
            req.finish(FinishReason.CANCELLED)

    def _abort_deadline(self, req: TrtRequest) -> None:
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
        await rebuild(self._build, why, self._failed_restart)
        self._failure = None
        log.warning("TensorRT-LLM restarted after: %s", why)

    def _failed_restart(self, why: str) -> None:
        self._failure = why
        log.error("%s", why)

    async def _stop_following(self) -> None:
        """Stop following every TensorRT-LLM request (they may never get a response)."""
        tasks = [r.task for r in self._in_trt if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._in_trt.clear()
