"""A Prometheus histogram for observations made on the event loop's thread only, without a lock.

prometheus_client's `Histogram.observe` takes a lock twice per observation (the sum's and the
bucket's `MutexValue.inc`, prometheus_client/values.py), thread-safety the event loop does not
need. Per token and per delivered event, at GPU rates, that was an eighth of the loop's work. This
one counts in plain lists and is read at scrape time through a collector (the scrape also runs on
the event loop: `/metrics` is a route), exposing the same family a `Histogram` would.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class LoopHistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1  # bucket i: amount <= bound i
        self.sum += amount


class LoopHistogram(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        if not self.labelnames:  # exposed at zero from the first scrape, as a Histogram is
            self.labels()
        registry.register(self)

    def labels(self, *values: str) -> LoopHistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LoopHistogramChild(self.bounds)
        return child

    def observe(self, amount: float) -> None:
        self.labels().observe(amount)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))  # as Histogram labels them
            family.add_metric(list(values), buckets, sum_value=child.sum)
        yield family
