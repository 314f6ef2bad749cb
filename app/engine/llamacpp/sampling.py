"""Picking each sequence's next token from its logits, with numpy, on the engine's loop thread.

llama.cpp's own sampler chain (src/llama-sampler.cpp, `llama_sampler_sample`) first copies all
49,152 logits into an array of (id, logit, p) structs, then each sampler in the chain walks it: the
repeat penalties look every token up in a hash map, and a temperature draw without min-p takes a
softmax of the whole vocabulary. Measured on the dev box, per token: 0.17 ms greedy, 0.28 ms
sampled with min-p, 0.58-0.68 ms with the repeat penalty on (the chat's and /v1's default), 0.77 ms
sampled with temperature alone. The loop thread does this for every running sequence while the
compute threads wait, so at 8 streams it added ~5 ms to a ~57 ms step.

Here the same chain works on a numpy view of the logits llama.cpp already holds (no copy): the
penalties touch only the tokens the reply has used, and min-p and top-k cut the vocabulary in one
vectorised pass before anything is sorted or exponentiated. Each step of the chain follows
llama.cpp's definition (src/llama-sampler.cpp), in this order:

    penalties      for each token the reply has used `count` times: logit *= repeat when <= 0, else
                   /= repeat; then -= count x frequency + presence (`llama_sampler_penalties_apply`;
                   the window is the whole reply, not llama.cpp's 64 tokens; the prompt is not fed)
    greedy         the first token with the highest logit (`llama_sampler_greedy_apply`), or:
    min-p          logits >= max + ln(min_p) (`llama_sampler_min_p_apply`, its unsorted path)
    top-k          the k highest logits (k > 0); the same tokens as llama.cpp's top-k-then-min-p
    top-p          by softmax probability, the most likely tokens until their sum reaches top_p,
                   the one that crosses it included (`llama_sampler_top_p_apply`)
    temperature    logits / temperature, then a seeded draw from their softmax (`..._dist_apply`)

The draw uses numpy's PCG64 seeded with the request's seed, not llama.cpp's mt19937: the same seed
gives the same reply here, but not the reply llama.cpp's own chain would have drawn.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from app.engine.base import SamplingParams

_SORT_FIRST = 256  # top-p sorts this many best candidates first, all of them only if needed
_BLOCK = 1024  # a draw over more candidates sums them in blocks of this many first


class TokenSampler:
    """One sequence's sampler: its parameters, its random stream and the counts for penalties."""

    __slots__ = ("_counts", "_params", "_penalised", "_rng")

    def __init__(self, params: SamplingParams, seed: int) -> None:
        self._params = params
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._counts: Counter[int] = Counter()
        self._penalised = params.penalised

    def sample(self, logits: np.ndarray) -> int:
        """The next token from one row of logits (float32, the vocabulary's length). The row may be
        changed in place: it is llama.cpp's output buffer, rewritten by the next decode anyway."""
        params = self._params
        if self._penalised and self._counts:
            self._penalise(logits)
        if params.greedy:
            token = int(np.argmax(logits))
        else:
            token = self._draw(logits)
        if self._penalised:
            self._counts[token] += 1
        return token

    def _penalise(self, logits: np.ndarray) -> None:
        p = self._params
        ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        seen = logits[ids]
        seen = np.where(seen <= 0, seen * p.repeat_penalty, seen / p.repeat_penalty)
        logits[ids] = seen - (counts * p.frequency_penalty + p.presence_penalty)

    def _draw(self, logits: np.ndarray) -> int:
        p = self._params
        ids: np.ndarray | None = None  # candidate token ids (None: the whole vocabulary)
        values = logits
        # min-p before top-k: both keep the highest logits above a cut (min-p's threshold is set
        # by the maximum, which top-k always keeps), so either order keeps the same tokens; but
        # min-p is one vectorised compare while top-k partitions the whole vocabulary (~35 µs of
        # a ~60 µs token on the dev box), and after min-p few candidates are left (median 3).
        if p.min_p > 0.0:
            ids = np.flatnonzero(values >= values.max() + math.log(p.min_p))
            values = values[ids]
        if 0 < p.top_k < len(values):
            best = np.sort(np.argpartition(values, -p.top_k)[-p.top_k :])  # in id order
            ids = best if ids is None else ids[best]
            values = values[best]
        if p.top_p < 1.0 and len(values) > 1:
            ids, values = _top_p(np.arange(len(values)) if ids is None else ids, values, p.top_p)
        weights = values - values.max()  # a new array: the logits row stays as it was
        weights /= p.temperature
        np.exp(weights, out=weights)
        at = _pick(weights, self._rng.random())
        return at if ids is None else int(ids[at])


def _pick(weights: np.ndarray, u: float) -> int:
    """The index where the running sum of `weights` first passes `u` x their total: a draw in
    proportion to the weights. numpy's cumsum walks one element at a time (~0.2 ms over the whole
    vocabulary), so a long array is summed in blocks first and only one block is walked."""
    if len(weights) <= 2 * _BLOCK:
        cumulative = np.cumsum(weights, dtype=np.float64)
        return min(
            int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), len(weights) - 1
        )
    blocks = np.cumsum(
        np.add.reduceat(weights, np.arange(0, len(weights), _BLOCK)), dtype=np.float64
    )
    target = u * blocks[-1]
    block = min(int(np.searchsorted(blocks, target, side="right")), len(blocks) - 1)
    start = block * _BLOCK
    inner = np.cumsum(weights[start : start + _BLOCK], dtype=np.float64)
    before = blocks[block - 1] if block else 0.0
    at = int(np.searchsorted(inner, target - before, side="right"))
    return min(start + at, len(weights) - 1)


def _top_p(ids: np.ndarray, values: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The most likely candidates whose probabilities first sum to `top_p` (the last one in),
    most likely first; the best `_SORT_FIRST` are sorted first and the rest only if they fall short
    (llama.cpp's top-p does the same with 256)."""
    probs = values - values.max()
    np.exp(probs, out=probs)
    probs /= probs.sum(dtype=np.float64)
    if len(probs) > _SORT_FIRST:
        best = np.argpartition(probs, -_SORT_FIRST)[-_SORT_FIRST:]
        order = best[np.argsort(-probs[best], kind="stable")]
        if probs[order].sum() < top_p:
            order = np.argsort(-probs, kind="stable")
    else:
        order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    last = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    order = order[: min(last, len(order))]
    return ids[order], values[order]
