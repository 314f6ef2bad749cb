"""The sampling parameters of the engine contract: their ranges, checked once for every engine."""

from __future__ import annotations

import math

import pytest

from app.engine.base import SamplingParams


@pytest.mark.parametrize(
    "field, bad",
    [
        ("min_p", -0.01),
        ("min_p", 1.01),
        ("min_p", math.nan),
        ("frequency_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("presence_penalty", 3.0),
        ("presence_penalty", math.nan),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", 2.5),
        ("repeat_penalty", -1.0),
    ],
)
def test_out_of_range_values_are_refused(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: bad})


@pytest.mark.parametrize(
    "field, good",
    [
        ("min_p", 0.0),
        ("min_p", 1.0),
        ("frequency_penalty", -2.0),
        ("frequency_penalty", 2.0),
        ("presence_penalty", -2.0),
        ("repeat_penalty", 0.5),
        ("repeat_penalty", 2.0),
    ],
)
def test_in_range_values_are_taken(field: str, good: float) -> None:
    assert getattr(SamplingParams(**{field: good}), field) == good


def test_penalised_only_when_a_penalty_is_on() -> None:
    assert not SamplingParams().penalised
    assert not SamplingParams(min_p=0.5).penalised  # min-p is a cut, not a penalty
    assert SamplingParams(repeat_penalty=1.1).penalised
    assert SamplingParams(frequency_penalty=-0.1).penalised
    assert SamplingParams(presence_penalty=0.2).penalised
