"""The llama.cpp engine's loop thread: it steps every running sequence, one batch at a time.

Shape of the loop (one iteration = one step = one `llama_decode`, or a few for an exact step):

    take new requests and aborts   (one queue the event loop fills, in order; never a lock held
                                    across a step; the sequences are this thread's alone)
    admit, fair across owners      (free sequence slot + room for the whole reply in the KV pool;
                                    a cached prefix of the owner's own earlier prompts is shared,
                                    not prefilled again: restored from host memory,
                                    `host_cache`, or shared in the unified pool, `prefix_cache`)
    build ONE batch                (a decode token per running sequence + prompt chunks, as many as
                                    the step clock allows: `step_clock`; exact graphs when a
                                    greedy sequence is in it: see `StepLoop._decode`, and
                                    `_decode_streams` for a stream per sequence)
    llama_decode                   (the GIL is released: the event loop keeps serving meanwhile)
    sample per sequence            (numpy over llama.cpp's logits rows: `sampling`)
    detokenise, check stop/EOS/length, free finished sequences' KV cells at once
    hand the step's events to asyncio in ONE call_soon_threadsafe
    time the step                  (the clock learns what decode and prompt tokens cost)

The thread never waits for a consumer: events go into each request's `EventStream`, which buffers.
As in llama.cpp's server (tools/server/server-queue.cpp: new tasks and cancels alike go through one
task queue, and the loop owns its slots alone), nothing crosses from the event loop but that queue:
an abort is a message in it, taken at the next step boundary, after the request's own submission.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.base import EngineEvent, FinishReason
from app.engine.llamacpp.host_cache import HostPrefixCache
from app.engine.llamacpp.native import EXACT_ROWS, PAD_TOKEN_POS, DecodeError, NativeModel
from app.engine.llamacpp.sampling import TokenSampler
from app.engine.llamacpp.scheduler import Chunk, Scheduler, SeqState, Sequence
from app.engine.llamacpp.step_clock import StepClock
from app.engine.llamacpp.stream_calls import plan_calls
from app.engine.requests import RequestState

log = logging.getLogger(__name__)

Deliver = Callable[[RequestState, EngineEvent], None]
Delivery = list[tuple[RequestState, EngineEvent]]


def _deliver_all(deliver: Deliver, events: Delivery) -> None:
    """Runs on the event loop: one step's events into their streams."""
    for request, event in events:
        deliver(request, event)


@dataclass(slots=True)
class StepCounters:
    """Plain counters, written by the loop thread only, read by `stats()` without a lock."""

    running: int = 0
    waiting: int = 0
    kv_used: int = 0
    steps: int = 0
    tokens_generated: int = 0
    step_errors: int = 0
    last_step_s: float = 0.0
    # where the loop thread's time goes, summed over steps (the per-step cost profile):
    # llama_decode, sampling, and the rest (scheduling, batching, detokenising, publishing)
    decode_s: float = 0.0
    sample_s: float = 0.0
    step_s: float = 0.0
    cache_cells: int = 0
    kv_walked: int = 0  # KV cells the last step's attention walked per query (`NativeModel`)
    taken: int = 0  # sequences taken out of the queue
    padded_steps: int = 0  # steps given a pad token (a lone greedy token: `StepLoop._decode`)


class StepLoop:
    """Runs the scheduler's sequences on one `NativeModel`, in a thread of its own."""

    def __init__(
        self,
        sched: Scheduler,
        clock: StepClock,
        deliver: Deliver,
        host_cache: HostPrefixCache | None = None,
    ) -> None:
        """`clock` sizes each step's prompt chunks; `deliver` takes each event on the event loop
        (the engine's `RequestTable.deliver`). `host_cache`: prefixes kept in host memory
        (`host_cache`; always so with a KV stream per sequence, `sched.pool` False); None: kept
        in the unified pool's own cells (`prefix_cache`)."""
        self._sched = sched
        self._host = host_cache
        self._streams = not sched.pool
        self._clock = clock
        self._deliver = deliver
        # one more sequence id, past the others, for the pad token of a one-token step
        self._pad_seq = sched.n_seq_ids
        self._native: NativeModel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.alive = False  # the thread runs and takes requests
        self._stopping = False
        # the one way in: a list is new requests, a lone sequence an abort (in the order sent)
        self._inbox: queue.SimpleQueue[list[Sequence] | Sequence] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._outbox: Delivery = []
        self._opening: list[int] = []
        self.counters = StepCounters()

    @property
    def started(self) -> bool:
        return self._thread is not None

    # --- called on the event loop ----------------------------------------------------------------

    def start(
        self, native: NativeModel, loop: asyncio.AbstractEventLoop, opening: list[int]
    ) -> None:
        """`opening`: the chat template's opening tokens, the prefix every prompt may share."""
        self._native, self._loop = native, loop
        self._opening = opening
        self._thread = threading.Thread(target=self._run, name="llamacpp-engine", daemon=True)
        self.alive = True
        self._thread.start()

    def submit(self, batch: list[Sequence]) -> None:
        """New requests, to be taken at the next step boundary."""
        self._inbox.put(batch)
        self._wake.set()

    def cancel(self, seq: Sequence) -> None:
        """End a sequence at the next step boundary (after its submission: send that first)."""
        self._inbox.put(seq)
        self._wake.set()

    def emit(self, request: RequestState, event: EngineEvent) -> None:
        """The sink of this loop's requests (loop thread): events wait for the step's end."""
        self._outbox.append((request, event))

    async def stop(self) -> None:
        """End every sequence (`cancelled`) and the thread; the model is closed once it is done."""
        thread = self._thread
        if thread is None:
            return
        first = not self._stopping
        self._stopping = True
        self._wake.set()
        await asyncio.to_thread(thread.join)
        if first:
            await asyncio.sleep(0)  # the thread's last call_soon_threadsafe runs before we return

    # --- the loop thread -------------------------------------------------------------------------

    def _run(self) -> None:
        native = self._native
        assert native is not None
        try:
            self._prefill_opening(native)
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
            self.alive = False
            self._take_new_and_aborts()
            self._end_all(FinishReason.ERROR, f"engine loop failed: {exc!r}")
        finally:
            self.alive = False
            self._take_new_and_aborts()
            self._end_all(FinishReason.CANCELLED, None)
            self._publish()
            self._native = None
            native.close()

    def _take_new_and_aborts(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, list):
                self.counters.taken += len(item)
                self._sched.waiting.extend(item)
            elif item.state is not SeqState.DONE:
                self._finish(item, FinishReason.CANCELLED)
        self._update_counters()

    def _update_counters(self) -> None:
        sched, counters = self._sched, self.counters
        counters.running = len(sched.running)
        counters.waiting = len(sched.waiting)
        counters.kv_used = sched.kv_used
        counters.cache_cells = sched.cache.cells

    def _step(self, native: NativeModel) -> None:
        t0 = time.perf_counter()
        sched = self._sched
        try:
            for seq in sched.admit(evict=lambda entry: native.forget(entry.seq_id)):
                self._start_from_cache(native, seq)
                seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(32)
                seq.sampler = TokenSampler(seq.params, seed)
            decoders = sched.decoders
            chunks = sched.plan(self._clock.prefill_budget(decoders, sched.max_step_tokens))
            exact = any(c.seq.params.greedy for c in chunks)
            t1 = time.perf_counter()
            if chunks:
                if self._streams and exact:
                    exact_done = self._decode_streams(native, chunks)
                else:
                    self._fill(native, chunks)
                    # with streams, llama.cpp's own split may leave a lone row (`stream_calls`)
                    exact_done = self._decode(native, exact=exact) and not self._streams
                if not exact_done:
                    for chunk in chunks:
                        chunk.seq.exact = False
            t2 = time.perf_counter()
            self.counters.kv_walked = native.kv_walked
            now = time.time()
            logits = native.logits
            for chunk in chunks:
                seq = chunk.seq
                seq.n_cached += len(chunk.tokens)
                if seq.batch_index >= 0:
                    t = time.perf_counter()
                    token = seq.sampler.sample(logits(seq.batch_index))
                    self.counters.sample_s += time.perf_counter() - t
                    self._accept(seq, token, now)
            self.counters.decode_s += t2 - t1
            if chunks:
                prompt_tokens = sum(len(chunk.tokens) for chunk in chunks) - decoders
                self._clock.record(decoders, prompt_tokens, time.perf_counter() - t0)
        except Exception as exc:
            log.exception("llama.cpp engine step failed")
            self.counters.step_errors += 1
            self._end_all(FinishReason.ERROR, f"engine step failed: {exc}")
            native.forget_all()
            sched.cache.clear()
            if self._host is not None:
                self._host.clear()  # the pinned opening is kept: its state is host memory
            else:
                self._prefill_opening(native)
        self.counters.steps += 1
        self._update_counters()
        self._publish()
        self.counters.last_step_s = step_s = time.perf_counter() - t0
        self.counters.step_s += step_s

    def _start_from_cache(self, native: NativeModel, seq: Sequence) -> None:
        """A newly admitted sequence takes the longest usable cached prefix of its prompt."""
        greedy = seq.params.greedy
        if self._host is not None:
            saved, reuse = self._host.lookup(seq.prompt, seq.owner, exact_only=greedy)
            if saved is not None:
                try:
                    native.restore_state(seq.slot, saved.state)
                except DecodeError:  # not worth failing the request for: it prefills it all
                    log.exception("could not restore a cached prefix")
                    native.forget(seq.slot)
                    return
                native.forget_from(seq.slot, reuse)
                seq.n_cached, seq.exact = reuse, saved.exact
            return
        entry, reuse = self._sched.cache.lookup(seq.prompt, seq.owner, exact_only=greedy)
        if entry is not None:
            native.share(entry.seq_id, seq.slot, reuse)
            seq.n_cached, seq.exact = reuse, entry.exact

    def _fill(self, native: NativeModel, chunks: list[Chunk]) -> None:
        """The step's batch as planned: each chunk's tokens in turn (slot order)."""
        batch = native.batch
        assert batch is not None
        batch.clear()
        for chunk in chunks:
            seq = chunk.seq
            last = batch.add_run(chunk.tokens, chunk.start, seq.slot, chunk.wants_logits)
            seq.batch_index = last if chunk.wants_logits else -1

    def _decode_streams(self, native: NativeModel, chunks: list[Chunk]) -> bool:
        """An exact step with a KV stream per sequence, in the calls `stream_calls` lays out;
        returns whether every graph was exact. A chunk may give its last token back (it goes
        in the next step); pad rows are dropped again after the step."""
        batch = native.batch
        assert batch is not None
        by_slot = {chunk.seq.slot: chunk for chunk in chunks}
        layout = plan_calls(
            {slot: len(c.tokens) for slot, c in by_slot.items()}, self._sched.max_seqs, EXACT_ROWS
        )
        for slot, n in layout.taken.items():
            chunk = by_slot[slot]
            if n < len(chunk.tokens):
                del chunk.tokens[n:]
                chunk.wants_logits = False
                chunk.seq.last_chunk = n
        batch.clear()
        slices, pads = [], []
        for call in layout.calls:
            start = len(batch)
            for part in call:
                if part.pad:  # at the stream's end: a prompt not in this step, or an empty one
                    pos = next((s.n_cached for s in self._sched.running if s.slot == part.slot), 0)
                    batch.add_run([native.pad_token], pos, part.slot, False)
                    pads.append((part.slot, pos))
                    continue
                chunk = by_slot[part.slot]
                end = part.offset + part.n
                wants = chunk.wants_logits and end == len(chunk.tokens)
                index = batch.add_run(
                    chunk.tokens[part.offset : end], chunk.start + part.offset, part.slot, wants
                )
                if end == len(chunk.tokens):
                    chunk.seq.batch_index = index if wants else -1
            slices.append((start, len(batch)))
        if pads:
            self.counters.padded_steps += 1
        try:
            native.decode(slices=slices)
        finally:
            for slot, pos in pads:
                native.forget_from(slot, pos)
        return layout.exact

    def _prefill_opening(self, native: NativeModel) -> None:
        """Compute the shared opening's cells once and pin them in the prefix cache (see
        `prefix_cache`): from then on no prompt prefills it again. In the unified pool they stay
        under a sequence id of their own; with the cache in host memory, they are computed in
        slot 0 and kept as a saved state (`host_cache`)."""
        host = self._host
        seq_id = self._sched.shared_seq_id if host is None else (0 if host.max_bytes else None)
        if seq_id is None or len(self._opening) < 2:
            return
        batch = native.batch
        assert batch is not None
        batch.clear()
        batch.add_run(self._opening, 0, seq_id, False)
        try:
            self._decode(native, exact=True)  # every greedy reply starts from these cells
            state = native.save_state(seq_id) if host is not None else None
        except Exception:  # not worth failing for: prompts then prefill it themselves
            log.exception("could not prefill the chat template's opening")
            native.forget(seq_id)
            return
        if host is not None and state is not None:
            native.forget(seq_id)
            host.pin(list(self._opening), state)
        else:
            self._sched.cache.pin(seq_id, list(self._opening))

    def _decode(self, native: NativeModel, *, exact: bool) -> bool:
        """Decode the step's batch; returns whether every graph was exact (see
        `native.EXACT_ROWS`): the cells it wrote then do not depend on the other rows.

        `exact` is asked for when the step holds a greedy sequence's tokens, so that a greedy reply
        does not depend on the other requests in the pool: the batch then goes in graphs of 2 to
        `EXACT_ROWS` rows. A lone token gets a throwaway token of a scratch sequence beside it, to
        make its graph two rows; its cell is freed at once and nobody attends to it. Exactness
        costs: the second row took a lone stream's step from 7.7 to 12.1 ms on a 2-CPU EPYC, and a
        ~1,000-token prompt's prefill 4.2 s instead of 3.1-3.4 in 512-row graphs (bench/README.md,
        issue 12 part 5). A step of sampled sequences only, whose logits already move with the
        pool's cell layout (tests/engine/test_llamacpp.py, `test_seeded_sampling_is_reproducible`),
        therefore goes as llama.cpp's own server would: one graph per 512 tokens, a lone token
        alone. Its cells are then marked inexact, and greedy prompts do not reuse them.
        """
        batch = native.batch
        assert batch is not None
        n = len(batch)
        if not exact:
            native.decode()
            return 2 <= n <= EXACT_ROWS
        padded = n == 1
        if padded:
            self.counters.padded_steps += 1
            batch.add_run([native.pad_token], PAD_TOKEN_POS, self._pad_seq, False)
        try:
            native.decode(max_rows=EXACT_ROWS)
        finally:
            if padded:
                native.forget(self._pad_seq)
        return True

    def _accept(self, seq: Sequence, token: int, now: float) -> None:
        """One sampled token: count it, turn it into text, and decide whether the reply is over."""
        native = self._native
        assert native is not None
        seq.generated.append(token)
        self.counters.tokens_generated += 1
        if native.is_eog(token):
            seq.count(1, now)
            self._finish(seq, FinishReason.STOP)
        elif seq.tokens((token,), native.piece(token), now):  # a stop string
            self._finish(seq, FinishReason.STOP)
        elif seq.completion_tokens >= seq.max_tokens:
            self._finish(seq, FinishReason.LENGTH)
        else:
            seq.next_token = token

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """End a sequence: free its slot and cells now, and queue its last events."""
        slot = seq.slot if seq.state is SeqState.RUNNING else -1
        self._sched.release(seq)
        native = self._native
        if native is not None:
            if slot >= 0:
                if reason is not FinishReason.ERROR and not self._stopping:
                    self._keep_for_reuse(native, seq, slot)
                native.forget(slot)
        seq.finish(reason, error)

    def _keep_for_reuse(self, native: NativeModel, seq: Sequence, slot: int) -> None:
        """Hand a finished sequence's cells to the prefix cache (before its own id lets go)."""
        tokens = seq.cached_tokens()
        host = self._host
        if host is not None:
            if host.wants(tokens, seq.owner, exact=seq.exact):
                try:
                    state = native.save_state(slot)
                except DecodeError:  # the reply is done all the same; only the cache misses it
                    log.exception("could not save a finished sequence's state")
                    return
                host.store(tokens, seq.owner, exact=seq.exact, state=state)
            return
        cache = self._sched.cache
        if not cache.seq_ids:
            return
        plan = cache.plan_store(tokens, seq.owner, exact=seq.exact)
        if plan is None:
            return
        if plan.replaces is not None:
            native.forget(plan.seq_id)
        native.share(slot, plan.seq_id, len(tokens))
        for evicted in cache.commit_store(plan, tokens, seq.owner, exact=seq.exact):
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
            loop.call_soon_threadsafe(_deliver_all, self._deliver, events)
        except RuntimeError:  # the event loop closed under us: nobody is listening any more
            pass
