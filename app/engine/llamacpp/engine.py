"""The embedded CPU engine: llama.cpp with continuous batching, driven from one Python thread.

    engine = LlamaCppEngine(EngineSettings())
    await engine.start()
    async for event in engine.generate("r1", [{"role": "user", "content": "Hi"}], SamplingParams()):
        ...

Loading: the GGUF file, its chat template and llama.cpp's context, sized from the settings: one
KV pool every sequence shares, or a stream per sequence (`ENGINE_KV_LAYOUT`, app/settings.py).
The stepping runs in `loop.StepLoop`'s thread; this side only hands it requests and aborts
through its queue from the event loop, and never blocks on it. Requests made in one event-loop tick
reach the same step boundary (see `_hand_over`). An abort is queued behind them; the loop ends the
sequence at the next step boundary. The open requests' table (`app.engine.requests`) is the event
loop's; the sequences in the scheduler are the loop thread's alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from app.engine.base import (
    ChatMessages,
    EngineError,
    EngineStats,
    EngineUnavailableError,
    PrefixCacheStats,
    SamplingParams,
)
from app.engine.chat_template import ChatTemplate
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.llamacpp.host_cache import HostPrefixCache
from app.engine.llamacpp.loop import StepLoop
from app.engine.llamacpp.model_files import resolve_model_path
from app.engine.llamacpp.native import ContextConfig, NativeModel
from app.engine.llamacpp.prefix_cache import common_prefix_len
from app.engine.llamacpp.scheduler import Scheduler, Sequence
from app.engine.llamacpp.step_clock import StepClock
from app.engine.requests import TableEngine, reply_room
from app.engine.token_counting import MessageCounter
from app.settings import EngineSettings

log = logging.getLogger(__name__)


class LlamaCppEngine(TableEngine[Sequence]):
    """`Engine` over llama.cpp's C API; the stepping itself is `loop.StepLoop`."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        flash_attn: bool = True,
        prefix_cache: int = 8,
    ) -> None:
        """`prefix_cache`: 0 turns the prefix cache off. With its prefixes in host memory
        (`settings.prefix_cache_store`, always so with a stream per sequence) any other number
        leaves it bounded by `settings.prefix_cache_mb` (see `host_cache`); kept in the unified
        pool, it is how many finished sequences keep their cells there, at most an eighth of
        the pool (see `prefix_cache`)."""
        super().__init__()
        self.settings = settings
        self._flash_attn = flash_attn
        self._kv_unified = settings.kv_layout == "unified"
        in_pool = self._kv_unified and settings.prefix_cache_store == "pool"
        self._model_path = resolve_model_path(settings.model_path)
        self._model_name = self._model_path.name.removesuffix(".gguf")
        self._context_size = settings.context_size or settings.kv_cells  # until the GGUF says
        self._native: NativeModel | None = None
        self._template: ChatTemplate | None = None
        self._counter: MessageCounter | None = None
        self._sched = Scheduler(
            max_seqs=settings.max_seqs,
            kv_cells=settings.kv_cells,
            max_step_tokens=settings.max_step_tokens,
            cache_entries=prefix_cache if in_pool else 0,
            pool=self._kv_unified,
        )
        self._host_cache = (
            None
            if in_pool
            else HostPrefixCache(settings.prefix_cache_mb << 20 if prefix_cache else 0)
        )
        self._accepting = False
        self._pending: list[Sequence] = []  # generated this event-loop tick, not yet handed over
        self._n_handed = 0  # sequences handed to the loop thread (the event loop writes)
        clock = StepClock(stretch=settings.step_stretch, floor_s=settings.step_floor_ms / 1000)
        self._steps = StepLoop(self._sched, clock, self.requests.deliver, self._host_cache)
        self._kv_total = settings.kv_cells

    # --- Engine protocol -------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_size(self) -> int:
        return self._context_size

    def count_tokens(self, message: Mapping[str, str]) -> int:
        if self._counter is None:
            raise EngineUnavailableError("the llama.cpp engine is not running")
        return self._counter.count(message)

    @property
    def prompt_overhead(self) -> int:
        return 0 if self._counter is None else self._counter.overhead

    async def start(self) -> None:
        if self._steps.started:
            return
        self._loop = asyncio.get_running_loop()
        if not self._kv_unified and self.settings.kv_cells // self.settings.max_seqs < 256:
            raise EngineError(
                "ENGINE_KV_LAYOUT=streams gives each of ENGINE_MAX_SEQS sequences "
                "ENGINE_KV_CELLS / ENGINE_MAX_SEQS cells: "
                f"{self.settings.kv_cells} / {self.settings.max_seqs} is under 256"
            )
        config = ContextConfig(
            kv_cells=self.settings.kv_cells,
            # unified: the last id is the pad token's; streams: pads use free streams
            max_seqs=self._sched.n_seq_ids + (1 if self._kv_unified else 0),
            # llama.cpp reserves an output row per sequence id and aborts if n_batch is smaller
            batch_tokens=max(self._sched.max_step_tokens, self._sched.n_seq_ids) + 1,
            threads=self.settings.threads,
            flash_attn=self._flash_attn,
            kv_unified=self._kv_unified,
        )
        native = await asyncio.to_thread(NativeModel, self._model_path, config)
        try:
            self._template = ChatTemplate(
                native.meta("tokenizer.chat_template"),
                bos_token=native.token_text(native.bos),
                eos_token=native.token_text(native.eos),
            )
        except BaseException:
            native.close()
            raise
        self._native = native
        template = self._template
        self._counter = MessageCounter(
            lambda messages, opener: template.render(messages, add_generation_prompt=opener),
            native.tokenize,
        )
        # The model id stays the file's stem ("SmolLM2-135M-Instruct.Q4_1"): GGUF's general.name
        # is free text with spaces, a poor id for /v1/models and OpenAI clients.
        # ENGINE_CONTEXT 0 (the default): what the model was trained on (GGUF n_ctx_train); one
        # sequence can never hold more than that, nor more than the KV pool (less a pad cell)
        # (with a stream per sequence, its own stream less a cell for a pad row)
        wanted = self.settings.context_size or native.n_ctx_train
        self._context_size = min(wanted, native.n_ctx_seq - 1, native.n_ctx_train)
        self._kv_total = native.n_ctx
        self._sched.kv_cells = native.n_ctx - 1  # a cell stays free for the pad token
        self._accepting = True
        self._steps.start(native, self._loop, self._opening(native, self._template))
        log.info(
            "llama.cpp engine: %s, %d KV cells (%s), %d seqs, steps up to %d tokens, %d threads",
            self._model_path,
            native.n_ctx,
            self.settings.kv_layout,
            self.settings.max_seqs,
            self._sched.max_step_tokens,
            self.settings.threads,
        )

    @staticmethod
    def _opening(native: NativeModel, template: ChatTemplate) -> list[int]:
        """What every prompt's tokens start with before the first message's own text: two
        conversations that differ only there, tokenised, up to where they part."""
        a, b = (native.tokenize(template.render([{"role": "user", "content": c}])) for c in "AZ")
        return a[: common_prefix_len(a, b)]

    async def shutdown(self) -> None:
        self._accepting = False
        self._hand_over()  # whatever this tick generated ends with the rest
        await self._steps.stop()

    def _unavailable(self) -> str | None:
        loaded = self._native is not None and self._template is not None
        ready = self._accepting and self._steps.alive and loaded
        return None if ready else "the llama.cpp engine is not running"

    def _open(
        self, request_id: str, messages: ChatMessages, params: SamplingParams, owner: str | None
    ) -> Sequence:
        native, template = self._native, self._template
        assert native is not None and template is not None
        prompt = native.tokenize(template.render(messages))
        max_tokens = reply_room(len(prompt), self._context_size, params)
        if not prompt:
            raise EngineError("the rendered prompt is empty")
        return Sequence(
            params,
            prompt,
            max_tokens,
            request_id=request_id,
            prompt_tokens=len(prompt),
            owner=owner,
            detok=IncrementalDetokenizer(stop=params.stop),
            sink=self._steps.emit,  # events leave the loop thread once per step
        )

    def _submit(self, seq: Sequence) -> None:
        if not self._pending:
            self._loop.call_soon(self._hand_over)  # type: ignore[union-attr]
        self._pending.append(seq)

    def _hand_over(self) -> None:
        """Pass this tick's new requests to the loop thread in one go.

        Requests generated in the same event-loop tick (say, an `asyncio.gather`) thus reach the
        same step boundary: they are admitted and prefilled together rather than one per wake-up.
        """
        if self._pending:
            batch, self._pending = self._pending, []
            self._n_handed += len(batch)
            self._steps.submit(batch)

    def _abort(self, seq: Sequence) -> None:
        self._hand_over()  # the loop takes its queue in order: the request first, then its abort
        self._steps.cancel(seq)

    def stats(self) -> EngineStats:
        counts = self._steps.counters
        in_inbox = max(self._n_handed - counts.taken, 0)
        cache = self._host_cache or self._sched.cache
        shared = sum(len(e.tokens) for e in cache.entries if e.shared)
        return EngineStats(
            running=counts.running,
            waiting=counts.waiting + len(self._pending) + in_inbox,
            kv_used=counts.kv_used,
            kv_total=self._kv_total,
            kv_walked=counts.kv_walked or None,
            steps=counts.steps,
            tokens_generated=counts.tokens_generated,
            prefix_cache=PrefixCacheStats(
                hits=cache.hits,
                misses=cache.misses,
                reused_tokens=cache.reused_tokens,
                entries=len(cache.entries),
                host_bytes=self._host_cache.bytes if self._host_cache is not None else 0,
            ),
            extra={
                "step_errors": counts.step_errors,
                "last_step_s": counts.last_step_s,
                "steps_seconds": counts.step_s,
                "decode_seconds": counts.decode_s,
                "sample_seconds": counts.sample_s,
                "padded_steps": counts.padded_steps,
                "prefix_cache_entries": len(cache.entries),
                "prefix_cache_cells": counts.cache_cells,
                "prefix_reused_tokens": cache.reused_tokens,
                "prefix_shared_tokens": shared,
            },
        )
