"""The lock-free event-loop histogram exposes exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from app.streaming.loop_histogram import LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1, 10)
AMOUNTS = [0.0, 0.0005, 0.001, 0.0010001, 0.05, 0.1, 0.5, 1.0, 9.99, 10.0, 11.0, 1e6]


def exposition(
    make: type, labelnames: tuple[str, ...], observe: dict[tuple[str, ...], list]
) -> str:
    registry = CollectorRegistry()
    histogram = make("test_gap_seconds", "Gaps.", labelnames, buckets=BUCKETS, registry=registry)
    for values, amounts in observe.items():
        child = histogram.labels(*values) if values else histogram
        for amount in amounts:
            child.observe(amount)
    # prometheus_client's own adds a `_created` sample; the loop histogram has none to offer
    return "\n".join(
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    )


@pytest.mark.parametrize(
    ("labelnames", "observe"),
    [
        ((), {(): AMOUNTS}),
        ((), {}),  # never observed: still exposed, at zero
        (("transport",), {("sse",): AMOUNTS, ("ws",): AMOUNTS[:3]}),
    ],
)
def test_same_exposition_as_prometheus_clients_histogram(
    labelnames: tuple[str, ...], observe: dict[tuple[str, ...], list]
) -> None:
    ours = exposition(LoopHistogram, labelnames, observe)
    theirs = exposition(Histogram, labelnames, observe)
    assert ours == theirs
    assert "test_gap_seconds_count" in ours or labelnames


def test_wrong_labels_are_refused() -> None:
    histogram = LoopHistogram(
        "test_x_seconds", "X.", ("transport",), buckets=BUCKETS, registry=CollectorRegistry()
    )
    with pytest.raises(ValueError, match="takes labels"):
        histogram.labels()
