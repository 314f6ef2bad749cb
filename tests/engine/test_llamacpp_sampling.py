"""The numpy sampler (app/engine/llamacpp/sampling.py) against llama.cpp's definitions of each step
of its chain (src/llama-sampler.cpp), on hand-made logits: no model needed."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from app.engine.base import SamplingParams
from app.engine.llamacpp.sampling import TokenSampler, _pick


def logits(*values: float, size: int = 0) -> np.ndarray:
    """A row of logits: `values` first, then `size - len(values)` tokens far below them."""
    row = np.full(max(size, len(values)), -30.0, dtype=np.float32)
    row[: len(values)] = values
    return row


def draws(params: SamplingParams, row: np.ndarray, n: int, seed: int = 1) -> Counter[int]:
    sampler = TokenSampler(params, seed)
    return Counter(sampler.sample(row.copy()) for _ in range(n))


def test_greedy_takes_the_first_highest_logit() -> None:
    assert TokenSampler(SamplingParams(temperature=0.0), 1).sample(logits(1, 5, 5, 2)) == 1


def test_penalties_follow_llama_cpp() -> None:
    """Per used token: x repeat when <= 0, / repeat when > 0, then - count x frequency -
    presence (`llama_sampler_penalties_apply`); the counts are the reply's own tokens."""
    params = SamplingParams(
        temperature=0.0, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=1.0
    )
    sampler = TokenSampler(params, 1)
    assert sampler.sample(logits(10.0, 9.0, -1.0)) == 0  # nothing used yet: no penalty
    row = logits(10.0, 9.0, -1.0)
    assert sampler.sample(row) == 1  # 10 / 2 - 0.5 - 1 = 3.5 < 9
    assert row[0] == pytest.approx(10.0 / 2 - 0.5 * 1 - 1.0)
    row = logits(10.0, 9.0, -1.0)
    sampler.sample(row)  # token 0 used once, token 1 once: both penalised once
    assert row[0] == pytest.approx(3.5) and row[1] == pytest.approx(9.0 / 2 - 0.5 - 1.0)
    assert row[2] == pytest.approx(-1.0)  # never used: untouched


def test_a_negative_logit_is_multiplied_by_the_repeat_penalty() -> None:
    sampler = TokenSampler(SamplingParams(temperature=0.0, repeat_penalty=1.5), 1)
    assert sampler.sample(logits(-1.0, -2.0)) == 0
    row = logits(-1.0, -2.0)
    assert sampler.sample(row) == 0 and row[0] == pytest.approx(-1.5)  # -1.5 still beats -2
    row = logits(-1.0, -1.2)
    assert sampler.sample(row) == 1  # -1 x 1.5 = -1.5 now loses to -1.2


def test_min_p_keeps_only_tokens_near_the_best() -> None:
    """min_p 0.5: only tokens with p >= p_max / 2, i.e. logit >= max - ln 2 (min_p's unsorted path)."""
    row = logits(3.0, 2.5, 2.0, 1.0, size=50_000)  # 2.5 >= 3 - 0.693 > 2.0
    seen = draws(SamplingParams(temperature=2.0, min_p=0.5), row, 2000)
    assert set(seen) == {0, 1}
    assert draws(SamplingParams(temperature=2.0, min_p=1.0), row, 200) == Counter({0: 200})


def test_top_k_keeps_the_k_best() -> None:
    row = logits(1.0, 4.0, 3.0, 2.0, size=1000)
    assert set(draws(SamplingParams(temperature=2.0, top_k=2), row, 2000)) == {1, 2}


def test_top_k_and_min_p_keep_what_llama_cpp_keeps_whichever_binds() -> None:
    """llama.cpp cuts top-k, then min-p; the sampler cuts min-p first (cheaper) and must keep the
    same tokens: the k best of those within ln(1/min_p) of the maximum."""
    row = logits(5.0, 4.9, 4.8, 4.7, 1.0, size=50_000)
    # top-k binds (min-p 0.5 would keep four)
    assert set(draws(SamplingParams(temperature=2.0, top_k=2, min_p=0.5), row, 2000)) == {0, 1}
    # min-p binds (top-k 4 would keep four; min-p 0.9 keeps logits >= 5 - 0.105)
    assert set(draws(SamplingParams(temperature=2.0, top_k=4, min_p=0.9), row, 2000)) == {0, 1}


def test_top_p_keeps_the_nucleus_including_the_token_that_crosses_it() -> None:
    """Probabilities 0.5, 0.3, 0.2 (over 3 tokens): top_p 0.6 keeps the first two (0.5 < 0.6,
    0.8 >= 0.6), top_p 0.45 the first alone (0.5 >= 0.45)."""
    row = np.log(np.array([0.2, 0.5, 0.3], dtype=np.float32))
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.6), row, 2000)) == {1, 2}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.45), row, 500)) == {1}


def test_top_p_over_a_whole_vocabulary_sorts_past_the_first_candidates_when_needed() -> None:
    """A flat distribution: the best 256 hold far less than top_p, so all must be sorted."""
    row = np.zeros(5000, dtype=np.float32)
    seen = draws(SamplingParams(temperature=1.0, top_p=0.9), row, 3000)
    assert len(seen) > 1500 and max(seen) >= 4000


@pytest.mark.parametrize("size", [3, 50_000])
def test_draws_follow_the_softmax_at_the_temperature(size: int) -> None:
    """p ~ exp(logit / T): logits ln(0.5), ln(0.3), ln(0.2) at T = 1, and at T = 0.5 the squares
    renormalised (0.25, 0.09, 0.04)/0.38; a long row checks the blocked draw (`_pick`)."""
    row = logits(*np.log([0.5, 0.3, 0.2]), size=size)
    n = 20_000
    for temperature, expected in ((1.0, (0.5, 0.3, 0.2)), (0.5, (0.25 / 0.38, 0.09 / 0.38))):
        seen = draws(SamplingParams(temperature=temperature), row, n)
        for token, p in enumerate(expected):
            assert abs(seen[token] / n - p) < 0.015, (temperature, token, seen[token] / n, p)


def test_the_blocked_draw_lands_on_every_block() -> None:
    weights = np.zeros(10_000, dtype=np.float32)
    weights[[0, 1023, 1024, 5000, 9999]] = 1.0
    picks = {_pick(weights, u) for u in np.linspace(0.0, 0.999, 1000)}
    assert picks == {0, 1023, 1024, 5000, 9999}


def test_the_same_seed_gives_the_same_draws() -> None:
    row = logits(*np.log([0.4, 0.3, 0.2, 0.1]), size=2000)
    params = SamplingParams(temperature=1.0)

    def reply(seed: int) -> list[int]:
        sampler = TokenSampler(params, seed)
        return [sampler.sample(row.copy()) for _ in range(200)]

    assert reply(42) == reply(42)
    assert reply(42) != reply(43)
