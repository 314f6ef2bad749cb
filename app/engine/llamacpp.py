"""The embedded CPU engine: llama.cpp with continuous batching, driven from one Python thread.

    engine = LlamaCppEngine(EngineSettings())
    await engine.start()
    async for event in engine.generate("r1", [{"role": "user", "content": "Hi"}], SamplingParams()):
        ...

Shape of the loop (one iteration = one step = one `llama_decode`):

    take new requests and aborts   (queues the event loop fills; never a lock held across a step)
    admit, fair across owners      (free sequence slot + room for the whole reply in the KV pool;
                                    a cached prefix of the owner's own earlier prompts is shared,
                                    not prefilled again)
    build ONE batch                (a decode token per running sequence + prompt chunks, budgeted;
                                    never a lone token: see `_decode_padded`)
    llama_decode                   (the GIL is released: the event loop keeps serving meanwhile)
    sample per sequence            (own sampler chain, reading only the rows flagged for logits)
    detokenise, check stop/EOS/length, free finished sequences' KV cells at once
    hand the step's events to asyncio in ONE call_soon_threadsafe

The thread never waits for a consumer: events go into each request's `EventStream`, which buffers.
`abort` only flags the sequence and wakes the loop; the loop ends it at the next step boundary.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator

from app.engine.base import (
    ChatMessages,
    DuplicateRequestError,
    EngineError,
    EngineEvent,
    EngineStats,
    EngineUnavailableError,
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.chat_template import ChatTemplate
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.llamacpp_native import (
    MAX_UBATCH,
    PAD_TOKEN_POS,
    ContextConfig,
    NativeModel,
    needs_pad,
)
from app.engine.llamacpp_scheduler import Scheduler, SeqState, Sequence
from app.engine.model_files import resolve_model_path
from app.engine.streams import EventStream
from app.settings import EngineSettings

log = logging.getLogger(__name__)

Delivery = list[tuple[EventStream, EngineEvent]]


def _deliver(events: Delivery) -> None:
    """Runs on the event loop: push one step's events into their streams."""
    for stream, event in events:
        stream.push(event)


class LlamaCppEngine:
    """`Engine` over llama.cpp's C API; see the module docstring for the loop."""

    def __init__(
        self, settings: EngineSettings, *, flash_attn: bool = True, prefix_cache: int = 8
    ) -> None:
        """`prefix_cache`: how many finished sequences keep their cells for reuse (0: none); they
        keep at most an eighth of the KV pool (see `llamacpp_prefix_cache`)."""
        self.settings = settings
        self._flash_attn = flash_attn
        self._model_path = resolve_model_path(settings.model_path)
        self._model_name = self._model_path.name.removesuffix(".gguf")
        self._context_size = settings.context_size
        self._native: NativeModel | None = None
        self._template: ChatTemplate | None = None
        self._sched = Scheduler(
            max_seqs=settings.max_seqs,
            kv_cells=settings.kv_cells,
            step_token_budget=settings.step_token_budget,
            cache_entries=prefix_cache,
            idle_prefill=MAX_UBATCH,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._stopping = False
        self._inbox: queue.SimpleQueue[list[Sequence]] = queue.SimpleQueue()
        self._pending: list[Sequence] = []  # generated this event-loop tick, not yet handed over
        self._n_handed = 0  # sequences put in the inbox (event loop thread writes)
        self._n_taken = 0  # ... and taken out of it (loop thread writes)
        self._aborts: queue.SimpleQueue[Sequence] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._open: dict[str, Sequence] = {}  # request id -> sequence, until it finishes
        self._outbox: Delivery = []
        # plain counters, written by the loop thread only, read by stats() without a lock
        self._n_running = 0
        self._n_waiting = 0
        self._kv_used = 0
        self._steps = 0
        self._tokens_generated = 0
        self._step_errors = 0
        self._last_step_s = 0.0
        self._cache_cells = 0
        self._kv_total = settings.kv_cells

    # --- Engine protocol -------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_size(self) -> int:
        return self._context_size

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        # one more sequence id, past the others, for the pad token of a one-token step
        self._pad_seq = self._sched.n_seq_ids
        config = ContextConfig(
            kv_cells=self.settings.kv_cells,
            max_seqs=self._sched.n_seq_ids + 1,
            # llama.cpp reserves an output row per sequence id and aborts if n_batch is smaller
            batch_tokens=max(self._sched.batch_capacity, self._sched.n_seq_ids) + 1,
            threads=self.settings.threads,
            flash_attn=self._flash_attn,
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
        # The model id stays the file's stem ("SmolLM2-135M-Instruct.Q4_1"): GGUF's general.name
        # is free text with spaces, a poor id for /v1/models and OpenAI clients.
        # one sequence can never hold more than the pool, nor more than the model was trained on
        self._context_size = min(self.settings.context_size, native.n_ctx, native.n_ctx_train)
        self._kv_total = native.n_ctx
        self._sched.kv_cells = native.n_ctx - 1  # a cell stays free for the pad token
        self._thread = threading.Thread(target=self._run, name="llamacpp-engine", daemon=True)
        self._accepting = True
        self._thread.start()
        log.info(
            "llama.cpp engine: %s, %d KV cells, %d seqs, %d-token steps, %d threads",
            self._model_path,
            native.n_ctx,
            self.settings.max_seqs,
            self.settings.step_token_budget,
            self.settings.threads,
        )

    async def shutdown(self) -> None:
        self._accepting = False
        thread = self._thread
        if thread is None or self._stopping:
            if thread is not None:
                await asyncio.to_thread(thread.join)
            return
        self._hand_over()  # whatever this tick generated ends with the rest
        self._stopping = True
        self._wake.set()
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # the loop thread's last call_soon_threadsafe runs before we return

    def generate(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        *,
        owner: str | None = None,
    ) -> AsyncIterator[EngineEvent]:
        native, template = self._native, self._template
        if not self._accepting or native is None or template is None:
            raise EngineUnavailableError("the llama.cpp engine is not running")
        if request_id in self._open:
            raise DuplicateRequestError(f"request {request_id!r} is already running")
        prompt = native.tokenize(template.render(messages))
        if len(prompt) >= self._context_size:
            raise PromptTooLongError(len(prompt), self._context_size)
        if not prompt:
            raise EngineError("the rendered prompt is empty")
        stream = EventStream(request_id, self.abort)
        seq = Sequence(
            request_id=request_id,
            params=params,
            prompt=prompt,
            max_tokens=min(params.max_tokens, self._context_size - len(prompt)),
            queued_at=time.time(),
            owner=owner,
            stream=stream,
            detok=IncrementalDetokenizer(stop=params.stop),
        )
        self._open[request_id] = seq
        if not self._pending:
            self._loop.call_soon(self._hand_over)  # type: ignore[union-attr]
        self._pending.append(seq)
        return stream

    def _hand_over(self) -> None:
        """Pass this tick's new requests to the loop thread in one go.

        Requests generated in the same event-loop tick (say, an `asyncio.gather`) thus reach the
        same step boundary: they are admitted and prefilled together rather than one per wake-up.
        """
        if self._pending:
            batch, self._pending = self._pending, []
            self._n_handed += len(batch)
            self._inbox.put(batch)
            self._wake.set()

    def abort(self, request_id: str) -> None:
        seq = self._open.get(request_id)
        if seq is None or seq.cancel_requested:
            return
        seq.cancel_requested = True
        self._aborts.put(seq)
        self._wake.set()

    def stats(self) -> EngineStats:
        return EngineStats(
            running=self._n_running,
            waiting=self._n_waiting + len(self._pending) + max(self._n_handed - self._n_taken, 0),
            kv_used=self._kv_used,
            kv_total=self._kv_total,
            steps=self._steps,
            tokens_generated=self._tokens_generated,
            extra={
                "step_errors": self._step_errors,
                "last_step_s": self._last_step_s,
                "prefix_cache_entries": len(self._sched.cache.entries),
                "prefix_cache_cells": self._cache_cells,
                "prefix_reused_tokens": self._sched.cache.reused_tokens,
            },
        )

    # --- the loop thread -------------------------------------------------------------------------

    def _run(self) -> None:
        native = self._native
        assert native is not None
        try:
            while not self._stopping:
                self._take_new_and_aborts()
                self._publish()  # cancellations reach their streams before the next decode
                if not self._sched.running and not self._sched.waiting:
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._step(native)
        except BaseException as exc:  # a bug in the loop itself: fail loudly, never hang a stream
            log.exception("llama.cpp engine loop died")
            self._accepting = False
            self._take_new_and_aborts()
            self._end_all(FinishReason.ERROR, f"engine loop failed: {exc!r}")
        finally:
            self._accepting = False
            self._take_new_and_aborts()
            self._end_all(FinishReason.CANCELLED, None)
            self._publish()
            self._native = None
            native.close()

    def _take_new_and_aborts(self) -> None:
        sched = self._sched
        while True:
            try:
                batch = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._n_taken += len(batch)
            sched.waiting.extend(seq for seq in batch if seq.state is SeqState.WAITING)
        while True:
            try:
                seq = self._aborts.get_nowait()
            except queue.Empty:
                break
            if seq.state is not SeqState.DONE:
                self._finish(seq, FinishReason.CANCELLED)
        self._update_counters()

    def _update_counters(self) -> None:
        sched = self._sched
        self._n_running = len(sched.running)
        self._n_waiting = len(sched.waiting)
        self._kv_used = sched.kv_used
        self._cache_cells = sched.cache.cells

    def _step(self, native: NativeModel) -> None:
        t0 = time.perf_counter()
        sched = self._sched
        try:
            for seq in sched.admit(evict=lambda entry: native.forget(entry.seq_id)):
                entry, reuse = sched.cache.lookup(seq.prompt, seq.owner)
                if entry is not None:
                    native.share(entry.seq_id, seq.slot, reuse)
                    seq.n_cached = reuse
                seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(32)
                seq.sampler = native.new_sampler(seq.params, seed)
            chunks = sched.plan()
            batch = native.batch
            assert batch is not None
            batch.clear()
            for chunk in chunks:
                seq = chunk.seq
                last = batch.add_run(chunk.tokens, chunk.start, seq.slot, chunk.wants_logits)
                seq.batch_index = last if chunk.wants_logits else -1
            if chunks:
                self._decode_padded(native)
            now = time.time()
            for chunk in chunks:
                seq = chunk.seq
                seq.n_cached += len(chunk.tokens)
                if seq.batch_index >= 0:
                    self._accept(seq, native.sample(seq.sampler, seq.batch_index), now)
        except Exception as exc:
            log.exception("llama.cpp engine step failed")
            self._step_errors += 1
            self._end_all(FinishReason.ERROR, f"engine step failed: {exc}")
            native.forget_all()
            sched.cache.clear()
        self._steps += 1
        self._update_counters()
        self._last_step_s = time.perf_counter() - t0
        self._publish()

    def _decode_padded(self, native: NativeModel) -> None:
        """Decode the step's batch, never as a one-row graph (see `llamacpp_native.needs_pad`).

        A lone decode (or a one-token prompt chunk) gets a throwaway token of a scratch sequence
        beside it: it makes the graph two rows, which keeps flash attention on the kernel whose
        result does not depend on the KV window, so a greedy reply does not depend on the other
        requests in the pool. Its cell is freed at once; nobody attends to it.
        """
        batch = native.batch
        assert batch is not None
        padded = needs_pad(len(batch))
        if padded:
            batch.add_run([native.pad_token], PAD_TOKEN_POS, self._pad_seq, False)
        try:
            native.decode()
        finally:
            if padded:
                native.forget(self._pad_seq)

    def _accept(self, seq: Sequence, token: int, now: float) -> None:
        """One sampled token: count it, turn it into text, and decide whether the reply is over."""
        native = self._native
        assert native is not None
        seq.generated.append(token)
        seq.completion_tokens += 1
        self._tokens_generated += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        if native.is_eog(token):
            self._finish(seq, FinishReason.STOP)
            return
        seq.unsent_ids.append(token)
        text, stopped = seq.detok.push(native.piece(token))
        if text:
            self._outbox.append((seq.stream, TextDelta(text, tuple(seq.unsent_ids))))
            seq.unsent_ids.clear()
        if stopped:
            self._finish(seq, FinishReason.STOP, flush=False)
        elif seq.completion_tokens >= seq.max_tokens:
            self._finish(seq, FinishReason.LENGTH)
        else:
            seq.next_token = token

    def _finish(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, *, flush: bool = True
    ) -> None:
        """End a sequence: free its slot, cells and sampler now, and queue its last events."""
        slot = seq.slot if seq.state is SeqState.RUNNING else -1
        self._sched.release(seq)
        native = self._native
        if native is not None:
            if slot >= 0:
                if reason is not FinishReason.ERROR and not self._stopping:
                    self._keep_for_reuse(native, seq, slot)
                native.forget(slot)
            if seq.sampler is not None:
                native.free_sampler(seq.sampler)
                seq.sampler = None
        if self._open.get(seq.request_id) is seq:
            del self._open[seq.request_id]
        tail = seq.detok.flush() if flush else ""
        if tail:
            self._outbox.append((seq.stream, TextDelta(tail, tuple(seq.unsent_ids))))
        self._outbox.append(
            (
                seq.stream,
                Finished(
                    reason=reason,
                    prompt_tokens=len(seq.prompt),
                    completion_tokens=seq.completion_tokens,
                    queued_at=seq.queued_at,
                    first_token_at=seq.first_token_at,
                    finished_at=time.time(),
                    error=error,
                    admitted_at=seq.admitted_at,
                ),
            )
        )

    def _keep_for_reuse(self, native: NativeModel, seq: Sequence, slot: int) -> None:
        """Hand a finished sequence's cells to the prefix cache (before its own id lets go)."""
        cache = self._sched.cache
        if not cache.seq_ids:
            return
        tokens = seq.cached_tokens()
        plan = cache.plan_store(tokens, seq.owner)
        if plan is None:
            return
        if plan.replaces is not None:
            native.forget(plan.seq_id)
        native.share(slot, plan.seq_id, len(tokens))
        for evicted in cache.commit_store(plan, tokens, seq.owner):
            native.forget(evicted.seq_id)

    def _end_all(self, reason: FinishReason, error: str | None) -> None:
        waiting = list(self._sched.waiting)
        self._sched.waiting.clear()  # first: each then ends without a queue search
        for seq in [*self._sched.running, *waiting]:
            self._finish(seq, reason, error)
        self._update_counters()

    def _publish(self) -> None:
        """Hand this step's events to asyncio in one call; never waits for anyone."""
        if not self._outbox:
            return
        events, self._outbox = self._outbox, []
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_deliver, events)
        except RuntimeError:  # the event loop closed under us: nobody is listening any more
            pass
