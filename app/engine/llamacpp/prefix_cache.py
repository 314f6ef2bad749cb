"""Keep finished sequences' KV cells around, so the next prompt that starts the same way skips ahead.

Chat prompts repeat themselves: every request starts with the same system prompt and template
scaffolding, and each turn of a conversation is the previous prompt plus the reply plus a new
message. Prefill is the expensive part of a request on CPU (a 1,000-token conversation costs
seconds), so a finished sequence hands its cells to a cache entry instead of dropping them, and a
newly admitted sequence copies the longest matching prefix from the best entry and prefills only
the rest.

In llama.cpp's unified KV pool, "copying" (`llama_memory_seq_cp`) only tags the same cells with one
more sequence id, so it costs nothing and shared cells are stored once. Entries live under their own
sequence ids, past the ones running sequences use. The cells they hold are free capacity in all
but name: admission evicts least recently used entries whenever it needs the room.

Kept cells are not free of charge, though: flash attention walks every occupied cell of the pool
for every query and skips other sequences' cells one by one, so a step gets slower as the occupied
range grows (8 decoding sequences: +33 ms per step with 8,000 foreign cells, on a ~60 ms step).
Hence a cap on the cells the cache keeps (`max_cells`), well below the pool; and, by default,
the cache in host memory instead (`host_cache`, `ENGINE_PREFIX_CACHE_STORE=host`): copying a
state in and out costs less than every query of every step walking past kept cells. This store
(`ENGINE_PREFIX_CACHE_STORE=pool`) remains for a pool whose memory is all there is.

Entries are scoped to one owner (the engine's opaque "whom is this for" key): a prompt reuses only
cells its own owner's earlier requests left. Reuse across owners would make one user's reply depend
on what others asked (a warm prefix is computed in another step than a cold one) and would tell a
user, through a shorter time to first token, that someone else had sent the same prefix. Eviction
stays global (least recently used first): the cells are one pool.

One entry is everybody's: the chat template's opening, what every prompt renders before the first
message's own text (SmolLM2's default system prompt: most of a short chat prompt). The engine
prefills it once at start (`pin`) and it is never evicted, so every request finds it warm: it
says nothing about anyone's traffic, and a reply computed over it is the same whoever came before.

Entries also say whether their cells are exact: computed only in graphs whose flash attention
skips other sequences' cells exactly (native.py, `EXACT_ROWS`). A greedy prompt reuses only
exact entries, so that a greedy reply stays the same whatever else ran beside the cells it reuses;
a sampled prompt reuses any of its owner's.

This module is bookkeeping only; the engine performs the native calls it asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

MIN_REUSE = 4  # shorter matches are not worth a copy


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix, comparing in slices (C speed) before token by token."""
    n = min(len(a), len(b))
    lo, step = 0, 64
    while lo + step <= n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


class Reusable(Protocol):
    """What both caches' entries say about themselves (this module's `Entry`, `host_cache.Saved`)."""

    tokens: list[int]
    owner: str | None
    shared: bool
    exact: bool


R = TypeVar("R", bound=Reusable)


def longest_match(
    entries: Iterable[R], prompt: list[int], owner: str | None, *, exact_only: bool
) -> tuple[R | None, int]:
    """The entry `owner` may reuse (its own or the shared opening; an exact one if `exact_only`)
    sharing the longest prefix with `prompt`, the first of equals, and that length (0: none)."""
    best, best_len = None, 0
    for entry in entries:
        if (entry.shared or entry.owner == owner) and (entry.exact or not exact_only):
            n = common_prefix_len(entry.tokens, prompt)
            if n > best_len:
                best, best_len = entry, n
    return best, best_len


@dataclass(eq=False, slots=True)
class Entry:
    seq_id: int
    tokens: list[int]  # exactly what the entry's cells hold, positions 0..len-1
    last_used: int = 0
    owner: str | None = None  # only this owner's prompts may reuse it ...
    shared: bool = False  # ... unless it is the pinned opening every prompt may reuse
    exact: bool = True  # every cell computed by an exact graph (see the module docstring)


@dataclass(slots=True)
class StorePlan:
    """Where a finished sequence's tokens go: drop `seq_id`'s cells first if `replaces`."""

    seq_id: int
    replaces: Entry | None


@dataclass(slots=True)
class PrefixCache:
    seq_ids: list[int]  # llama.cpp sequence ids reserved for entries
    max_cells: int = 1 << 30  # evict least recently used entries beyond this many cells
    entries: list[Entry] = field(default_factory=list)
    reused_tokens: int = 0  # prefill tokens saved since start
    hits: int = 0  # lookups that found a prefix to reuse
    misses: int = 0
    _clock: int = 0

    @property
    def cells(self) -> int:
        """Cells the entries hold (shared ones counted per entry: an upper bound)."""
        return sum(len(e.tokens) for e in self.entries)

    def _own(self, owner: str | None) -> list[Entry]:
        return [e for e in self.entries if e.owner == owner and not e.shared]

    def pin(self, seq_id: int, tokens: list[int]) -> Entry:
        """Record the shared opening (the caller prefilled `tokens` into `seq_id`, an id of its own,
        not one of `seq_ids`); it is never evicted."""
        entry = Entry(seq_id, tokens, shared=True)
        self.entries.append(entry)
        return entry

    def lookup(
        self, prompt: list[int], owner: str | None = None, *, exact_only: bool = False
    ) -> tuple[Entry | None, int]:
        """The owner's entry sharing the longest prefix with `prompt` (an exact one if
        `exact_only`), and how many tokens to take.

        At least the prompt's last token is left to prefill: its logits give the first reply token.
        """
        best, best_len = longest_match(self.entries, prompt, owner, exact_only=exact_only)
        best_len = min(best_len, len(prompt) - 1)
        if best is None or best_len < MIN_REUSE:
            self.misses += 1
            return None, 0
        self._clock += 1
        best.last_used = self._clock
        self.hits += 1
        self.reused_tokens += best_len
        return best, best_len

    def plan_store(
        self, tokens: list[int], owner: str | None = None, *, exact: bool = True
    ) -> StorePlan | None:
        """Decide where `tokens` (a finished sequence's cells, `exact` or not) should live, or
        None to drop them. Exact cells neither give way to inexact ones nor are replaced by them."""
        if not MIN_REUSE <= len(tokens) <= self.max_cells:
            return None
        own = self._own(owner)
        for entry in own:
            if common_prefix_len(entry.tokens, tokens) == len(tokens) and entry.exact >= exact:
                return None  # an entry already holds all of it
        for entry in own:  # an entry this one extends (the same chat, a turn later)
            if (
                common_prefix_len(entry.tokens, tokens) == len(entry.tokens)
                and exact >= entry.exact
            ):
                return StorePlan(entry.seq_id, entry)
        used = {e.seq_id for e in self.entries}
        free = [s for s in self.seq_ids if s not in used]
        if free:
            return StorePlan(free[0], None)
        evictable = [e for e in self.entries if not e.shared]
        if not evictable:
            return None
        victim = min(evictable, key=lambda e: e.last_used)
        return StorePlan(victim.seq_id, victim)

    def commit_store(
        self, plan: StorePlan, tokens: list[int], owner: str | None = None, *, exact: bool = True
    ) -> list[Entry]:
        """Record the stored entry; returns older entries evicted to respect `max_cells` (the
        caller drops their cells)."""
        if plan.replaces is not None:
            self.entries.remove(plan.replaces)
        self._clock += 1
        new = Entry(plan.seq_id, tokens, self._clock, owner, exact=exact)
        self.entries.append(new)
        evicted = []
        while self.cells > self.max_cells:
            victim = self.evict_lru(keep=new)
            if victim is None:
                break
            evicted.append(victim)
        return evicted

    def evict_lru(self, keep: Entry | None = None) -> Entry | None:
        """Remove and return the least recently used entry other than `keep` (None if none)."""
        candidates = [e for e in self.entries if e is not keep and not e.shared]
        if not candidates:
            return None
        victim = min(candidates, key=lambda e: e.last_used)
        self.entries.remove(victim)
        return victim

    def best_match(
        self, prompt: list[int], owner: str | None = None, *, exact_only: bool = False
    ) -> Entry | None:
        """Like `lookup` without touching recency or counters (to protect it from eviction)."""
        best, best_len = longest_match(self.entries, prompt, owner, exact_only=exact_only)
        return best if best_len >= MIN_REUSE else None

    def clear(self) -> None:
        self.entries.clear()
