"""Who runs this step, and with how many tokens: admission and chunked prefill, without llama.cpp.

Kept free of native calls so the policy reads (and can be checked) on its own:

- Admission is fair across owners and all-or-nothing per request: the request due next (the
  oldest waiting one of the owner with the fewest running, see `fair_queue`; FIFO within one
  owner) enters when a sequence id is free and the KV pool can hold its whole worst case
  (prompt + capped reply), so a running sequence never runs out of cells mid-reply and no
  preemption is needed. The pool, not a small fixed count, is what bounds the running set: the
  sequence ids (`max_seqs`) are many and cheap. A request that does not fit yet blocks the others,
  so a big one is never overtaken forever. Cells kept by the prefix cache count as used until
  admission needs them: then the least recently used entries go first, the entry the newcomer
  could reuse last.
- Each step plans one decode token for every sequence past its prompt, then spends the step's
  prompt budget (sized by time: `step_clock.StepClock`) on prompt chunks, first come first served
  within rounds across owners: each owner's first prompt in the queue before anyone's second, and
  within a round the earliest admitted first, so the earliest arrival gets its first token first
  and a newcomer's prompt does not wait behind someone's flood admitted just before it. A long
  prompt therefore enters in slices over several steps while everyone else keeps getting a token
  per step; beside decoders its slices start small and at most double (`FIRST_CHUNK`), unless
  it is short (`WHOLE_REST`).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from app.engine.base import SamplingParams
from app.engine.fair_queue import FairQueue
from app.engine.llamacpp.prefix_cache import Entry, PrefixCache
from app.engine.llamacpp.step_clock import MIN_PREFILL
from app.engine.requests import RequestState

# Beside decoding streams, a prompt's first chunk takes at most this many tokens and each next
# one at most twice the last: a token deep in a long prompt attends to all before it and costs
# several decode tokens on a CPU, more than the step clock has yet seen, so a first big chunk
# would stall everyone (measured: a 1,500-token prompt's first chunk made one 9x gap).
FIRST_CHUNK = 16
# ... unless what is left of it is this short: a new turn after a prefix-cache hit, or a short
# question, goes in whole, and the prompt due first gets that much even past the step clock's
# budget (as llama-server takes a whole prompt in a step). Slow-start steps or a budget cut
# would double or triple its time to first token (bench/multi_turn.py: 478 against
# llama-server's 298 ms p50 for later turns); the cost is one step at most ~2x longer.
WHOLE_REST = 128


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Sequence(RequestState):
    """One request's life inside the engine: its output side (`RequestState`) and its place in
    the batch."""

    params: SamplingParams
    prompt: list[int]
    max_tokens: int  # already capped so prompt + reply fits the per-sequence context
    state: SeqState = SeqState.WAITING
    slot: int = -1  # llama.cpp seq_id while running
    sampler: Any = None  # its TokenSampler (sampling) while running
    n_cached: int = 0  # tokens of this sequence in the KV cache
    next_token: int = -1  # sampled, to be decoded next step
    generated: list[int] = field(default_factory=list)  # every sampled token, in order
    batch_index: int = -1  # where this step's logits for it are, -1 for none
    last_chunk: int = 0  # prompt tokens its previous chunk took (slow start, see `plan`)
    exact: bool = True  # all its cells from exact graphs (prefix_cache, `Entry.exact`)

    @property
    def kv_reserve(self) -> int:
        """Worst-case cells: the last sampled token is never decoded, hence the -1."""
        return len(self.prompt) + self.max_tokens - 1

    @property
    def prefilling(self) -> bool:
        return self.n_cached < len(self.prompt)

    def cached_tokens(self) -> list[int]:
        """The tokens this sequence's KV cells hold, in position order."""
        n = self.n_cached
        return (
            self.prompt[:n]
            if n <= len(self.prompt)
            else self.prompt + self.generated[: n - len(self.prompt)]
        )


@dataclass(slots=True)
class Chunk:
    """Part of one step's batch: `tokens` of `seq` at positions from `start`."""

    seq: Sequence
    tokens: list[int]
    start: int
    wants_logits: bool  # the last token's logits are needed (a decode, or a prompt's final chunk)


def prefill_order(prefilling: list[Sequence]) -> list[Sequence]:
    """Who gets this step's prompt budget first (`prefilling` in admission order): each owner's
    first prompt before anyone's second, and so on; within a round, the earliest admitted."""
    rounds: Counter[str | None] = Counter()
    keyed = []
    for admitted, seq in enumerate(prefilling):
        keyed.append((rounds[seq.owner], admitted, seq))
        rounds[seq.owner] += 1
    keyed.sort(key=lambda k: k[:2])
    return [k[2] for k in keyed]


class Scheduler:
    """Slots, the KV reservation ledger, the fair waiting queue and the per-step plan."""

    def __init__(
        self,
        *,
        max_seqs: int,
        kv_cells: int,
        max_step_tokens: int,
        cache_entries: int = 0,
        cache_cells: int | None = None,
        pool: bool = True,
    ) -> None:
        """`max_step_tokens`: the most tokens one step may hold (decodes and prompt chunks).
        `pool` False: each sequence has a KV stream of its own, which its capped reply always
        fits (`reply_room`), so a free slot is all admission needs and `kv_cells` is unused."""
        self.max_seqs = max_seqs
        self.pool = pool
        self.kv_cells = kv_cells
        self.max_step_tokens = max(max_step_tokens, max_seqs + MIN_PREFILL)
        self.waiting: FairQueue[Sequence] = FairQueue(lambda seq: seq.owner)
        self.running: list[Sequence] = []  # in admission order
        # A heap: the lowest free slot first, so running sequences keep contiguous ids (with a KV
        # stream per sequence, llama.cpp puts only consecutive ids in one ubatch)
        self._free_slots = list(range(max_seqs))
        self.kv_reserved = 0
        # entries take the sequence ids after the running ones, the shared opening the next one
        self.cache = PrefixCache(
            list(range(max_seqs, max_seqs + cache_entries)),
            max_cells=kv_cells // 8 if cache_cells is None else cache_cells,
        )
        self.shared_seq_id = max_seqs + cache_entries if cache_entries else None

    @property
    def n_seq_ids(self) -> int:
        return self.max_seqs + len(self.cache.seq_ids) + (self.shared_seq_id is not None)

    @property
    def decoders(self) -> int:
        """Running sequences past their prompt: each takes a decode token in the next step."""
        return sum(1 for seq in self.running if not seq.prefilling)

    def _short(self, seq: Sequence) -> int:
        if not self.pool:
            return 0
        return self.kv_reserved + self.cache.cells + seq.kv_reserve - self.kv_cells

    def admit(self, evict: Callable[[Entry], None] = lambda _: None) -> Iterator[Sequence]:
        """Move the requests due next (see `FairQueue`) to running while a slot and cells are free.

        `evict` drops a prefix-cache entry's cells (the caller's native call) to make room.
        """
        while self.waiting and self._free_slots:
            head = self.waiting.peek()
            assert head is not None
            keep = self.cache.best_match(head.prompt, head.owner, exact_only=head.params.greedy)
            while self._short(head) > 0:
                victim = self.cache.evict_lru(keep) or self.cache.evict_lru()
                if victim is None:
                    break
                evict(victim)
            if self._short(head) > 0:
                return
            self.waiting.pop()
            head.slot = heapq.heappop(self._free_slots)
            head.state = SeqState.RUNNING
            head.admitted_at = time.time()
            self.kv_reserved += head.kv_reserve
            self.running.append(head)
            yield head

    def release(self, seq: Sequence) -> None:
        """Give back a running sequence's slot and reservation (the caller frees the cells)."""
        if seq.state is SeqState.RUNNING:
            heapq.heappush(self._free_slots, seq.slot)
            self.kv_reserved -= seq.kv_reserve
            self.running.remove(seq)
            self.waiting.done(seq)
        elif seq.state is SeqState.WAITING and seq in self.waiting:
            self.waiting.remove(seq)  # (an abort may overtake the request's own hand-over)
        seq.state = SeqState.DONE
        seq.slot = -1

    def plan(self, prefill_budget: int) -> list[Chunk]:
        """This step's batch: a decode token per decoder, then up to `prefill_budget` prompt tokens
        (bounded by `max_step_tokens` in all)."""
        chunks: list[Chunk] = []
        prefilling: list[Sequence] = []
        for seq in self.running:
            if seq.prefilling:
                prefilling.append(seq)
            else:
                chunks.append(Chunk(seq, [seq.next_token], seq.n_cached, True))
        decoding = bool(chunks)
        order = prefill_order(prefilling)
        if order and (head_rest := len(order[0].prompt) - order[0].n_cached) <= WHOLE_REST:
            prefill_budget = max(prefill_budget, head_rest)
        budget = min(prefill_budget, self.max_step_tokens - len(chunks))
        partial = False  # a prompt only partly taken this step
        for seq in order:
            if budget <= 0:
                break
            rest = len(seq.prompt) - seq.n_cached
            if partial and not self.pool and rest > budget:
                # with a stream per sequence llama.cpp computes each prompt's part of a step in
                # graphs of its own (`split_equal`: as many tokens of each sequence in a ubatch),
                # so a second partial prompt costs a pass over the weights for a few tokens
                continue
            take = min(rest, budget)
            if decoding and rest > WHOLE_REST:  # slow start: what a token costs deep in a long
                take = min(take, max(FIRST_CHUNK, 2 * seq.last_chunk))  # prompt is learnt first
            seq.last_chunk = take
            end = seq.n_cached + take
            chunks.append(
                Chunk(seq, seq.prompt[seq.n_cached : end], seq.n_cached, end == len(seq.prompt))
            )
            budget -= take
            partial = partial or take < rest
        chunks.sort(key=lambda chunk: chunk.seq.slot)  # in slot order (see `_free_slots`)
        return chunks

    @property
    def kv_used(self) -> int:
        return sum(seq.n_cached for seq in self.running)
