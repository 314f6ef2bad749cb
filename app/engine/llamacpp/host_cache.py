"""The prefix cache in host memory: finished sequences' states, copied out of the KV cache.

With a stream per sequence (`ENGINE_KV_LAYOUT=streams`) cells cannot be shared across sequences
by tagging, as `prefix_cache` does in the unified pool; and in the unified pool, cells kept for
reuse widen the window every query of every step walks (`ENGINE_PREFIX_CACHE_STORE`, the
default there too). So, like llama-server's `--cache-ram`
(tools/server/server-context.cpp: a slot's state saved with llama_state_seq_get_data when it is
released, and loaded into the slot of a new prompt that starts the same way), a finished
sequence's KV state is copied to host memory, and a newly admitted sequence whose prompt starts
with a saved one's tokens has it copied back into its stream and prefills only the rest.

The rules are the unified cache's (see `prefix_cache`): entries serve only their owner; the
chat template's opening is one shared entry, pinned, every prompt's; a greedy prompt reuses only
exact cells; a turn that extends an entry replaces it. Memory is bounded in bytes
(`ENGINE_PREFIX_CACHE_MB`): the least recently used entries go first. Bookkeeping only: the
engine loop makes the native calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.llamacpp.prefix_cache import MIN_REUSE, common_prefix_len, longest_match


@dataclass(eq=False, slots=True)
class Saved:
    tokens: list[int]  # what the state's cells hold, positions 0..len-1
    state: bytearray  # llama.cpp's serialised sequence state
    owner: str | None = None
    exact: bool = True
    shared: bool = False  # the pinned opening, everybody's
    last_used: int = 0


@dataclass(slots=True)
class HostPrefixCache:
    max_bytes: int
    entries: list[Saved] = field(default_factory=list)
    hits: int = 0  # admissions that started from a saved state
    misses: int = 0  # admissions that found none to start from
    reused_tokens: int = 0  # prefill tokens saved since start
    _clock: int = 0

    @property
    def bytes(self) -> int:
        return sum(len(e.state) for e in self.entries)

    def pin(self, tokens: list[int], state: bytearray) -> None:
        self.entries.append(Saved(tokens, state, shared=True))

    def lookup(
        self, prompt: list[int], owner: str | None, *, exact_only: bool
    ) -> tuple[Saved | None, int]:
        """The usable entry sharing the longest prefix with `prompt`, and how many tokens to take
        (never the prompt's last: its logits give the first reply token)."""
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

    def wants(self, tokens: list[int], owner: str | None, *, exact: bool) -> bool:
        """Whether a finished sequence's state is worth saving: no entry of its owner (or the
        shared one) already holds all of it, at least as exact."""
        if len(tokens) < MIN_REUSE:
            return False
        return not any(
            (e.shared or e.owner == owner)
            and e.exact >= exact
            and common_prefix_len(e.tokens, tokens) == len(tokens)
            for e in self.entries
        )

    def store(self, tokens: list[int], owner: str | None, *, exact: bool, state: bytearray) -> None:
        """Keep a saved state; the owner's entries it extends go, then the least recently used
        ones while the cache is over its bound (a state bigger than the bound is not kept)."""
        if len(state) > self.max_bytes:
            return
        self.entries = [
            e
            for e in self.entries
            if e.shared
            or e.owner != owner
            or exact < e.exact
            or common_prefix_len(e.tokens, tokens) < len(e.tokens)
        ]
        self._clock += 1
        self.entries.append(Saved(tokens, state, owner, exact, last_used=self._clock))
        while self.bytes > self.max_bytes:
            evictable = [e for e in self.entries if not e.shared]
            if not evictable:
                break
            self.entries.remove(min(evictable, key=lambda e: e.last_used))

    def clear(self) -> None:
        """Forget everything but the pinned opening (its cells do not depend on the failure)."""
        self.entries = [e for e in self.entries if e.shared]
