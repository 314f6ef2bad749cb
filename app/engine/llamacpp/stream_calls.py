"""An exact step with a KV stream per sequence: which rows go in which `llama_decode` call.

With one stream per sequence id, llama.cpp cuts a batch with `split_equal(sequential)`
(src/llama-batch.cpp): a ubatch holds a run of CONSECUTIVE sequence ids, the same number of
tokens of each. Its flash attention then sees a query tensor of [tokens per stream, heads,
streams], and ggml's CPU kernel (ggml/src/ggml-cpu/ops.cpp,
`ggml_compute_forward_flash_attn_ext_f16`) takes a split-KV path when that is ONE token of ONE
stream over 512 cells or more (`neq1 == 1 && neq3 == 1 && nek1 >= 512`), and a tiled one from
64 tokens of a stream (`neq1 >= GGML_FA_TILE_Q`). Both round differently from the plain path,
which walks each query's own cells one by one; a greedy reply must not depend on which path its
tokens took, i.e. on the load (see `native.EXACT_ROWS` for the unified pool's version of this).

So an exact step is laid out here, without llama.cpp, as calls of two kinds:
- one call of single rows (decode tokens, one-token prompt chunks), in slot order: llama.cpp makes
  a ubatch of each run of consecutive slots (one token per stream: never tiled, however many
  streams), and no run may be a lone row. A lone row gets a pad
  row beside it, in a neighbouring stream the step does not touch (a throwaway token at that
  stream's end, dropped after the call), or else the neighbouring prompt chunk lends it its first
  token (a two-token chunk then keeps only that one for this step, so that no lone row is left);
- then each longer prompt chunk on its own: one stream, 2 to `max_rows` (< 64) rows per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.engine.llamacpp.native import exact_slices


@dataclass(frozen=True, slots=True)
class Part:
    """`n` tokens of the chunk in `slot`, from its token `offset`; a pad row if `offset` < 0."""

    slot: int
    offset: int
    n: int

    @property
    def pad(self) -> bool:
        return self.offset < 0


@dataclass(slots=True)
class Layout:
    """One exact step: its llama_decode calls in order, each a list of parts in batch order."""

    calls: list[list[Part]]
    taken: dict[int, int]  # tokens each slot's chunk takes this step (a chunk may give one back)
    exact: bool  # False if a lone row found no partner (then its graph may differ)


def runs(slots: Iterable[int]) -> list[list[int]]:
    """Sorted slots cut into runs of consecutive ones."""
    out: list[list[int]] = []
    for slot in sorted(slots):
        if out and out[-1][-1] == slot - 1:
            out[-1].append(slot)
        else:
            out.append([slot])
    return out


def plan_calls(chunks: dict[int, int], n_slots: int, max_rows: int) -> Layout:
    """`chunks`: tokens this step asks of each slot (decoders 1, prompt chunks more)."""
    taken = dict(chunks)
    heads: set[int] = set()  # prompt chunks lending their first token to the single rows
    pads: set[int] = set()
    stuck: set[int] = set()

    def singles() -> set[int]:
        return {s for s, n in taken.items() if n == 1} | heads | pads

    changed = True
    while changed:
        changed = False
        for run in runs(singles()):
            if len(run) > 1 or run[0] in stuck:
                continue
            slot = run[0]
            near = [s for s in (slot + 1, slot - 1) if 0 <= s < n_slots]
            free = [s for s in near if s not in taken and s not in pads]
            lenders = [s for s in near if taken.get(s, 0) >= 2 and s not in heads]
            if free:
                pads.add(free[0])
            elif lenders:
                lender = lenders[0]
                if taken[lender] == 2:
                    taken[lender] = 1  # a one-token tail would be a lone row itself
                else:
                    heads.add(lender)
            else:
                stuck.add(slot)
                continue
            changed = True
            break

    single_rows = [Part(s, -1 if s in pads else 0, 1) for s in sorted(singles())]
    calls = [single_rows] if single_rows else []
    for slot in sorted(s for s, n in taken.items() if n >= 2):
        first = 1 if slot in heads else 0
        for a, b in exact_slices(taken[slot] - first, max_rows):
            calls.append([Part(slot, first + a, b - a)])
    return Layout(calls, taken, exact=not stuck)
