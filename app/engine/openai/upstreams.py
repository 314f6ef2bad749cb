"""The upstream servers of ENGINE=openai: which one takes the next request, and which are up.

Pure bookkeeping (the engine does the HTTP): each `Upstream` counts what it is serving and how it
fared; `UpstreamPool.pick` chooses among those that are up and have a free slot the one with the
fewest requests outstanding (ties: the one sent fewest so far, so an idle pair takes turns), and
`failed` marks an upstream down after `failures_to_down` failures in a row. What brings it back is
a successful health check (`probe` in app/engine/openai/engine.py), never a request: a down
upstream is sent nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from app.engine.base import BackendStats

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(eq=False, slots=True)
class Upstream:
    base_url: str  # the OpenAI API base: http://host:port/v1
    capacity: int  # requests sent to it at once at most (its slots)
    up: bool = False  # until a health check or a request says otherwise
    in_flight: int = 0
    failures_in_a_row: int = 0
    requests: int = 0
    errors: int = 0
    ttft_sum_s: float = 0.0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS_S) + 1))
    last_error: str | None = None

    @property
    def root(self) -> str:
        """The server's own address (llama-server's /props, /slots and /health live there)."""
        return self.base_url.removesuffix("/v1")

    @property
    def has_room(self) -> bool:
        return self.up and self.in_flight < self.capacity

    def record_ttft(self, seconds: float) -> None:
        self.ttft_sum_s += seconds
        self.ttft_counts[bisect.bisect_left(TTFT_BUCKETS_S, seconds)] += 1

    def stats(self) -> BackendStats:
        cumulative, buckets = 0, []
        for bound, count in zip(TTFT_BUCKETS_S, self.ttft_counts, strict=False):
            cumulative += count
            buckets.append((bound, cumulative))
        return BackendStats(
            name=self.base_url,
            up=self.up,
            in_flight=self.in_flight,
            capacity=self.capacity,
            requests=self.requests,
            errors=self.errors,
            ttft_sum_s=self.ttft_sum_s,
            ttft_count=sum(self.ttft_counts),
            ttft_buckets=tuple(buckets),
            last_error=self.last_error,
        )


class UpstreamPool:
    def __init__(self, upstreams: Iterable[Upstream], *, failures_to_down: int) -> None:
        self.upstreams = list(upstreams)
        self.failures_to_down = max(1, failures_to_down)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.upstreams)

    def pick(self, exclude: Collection[Upstream] = ()) -> Upstream | None:
        """The up upstream with a free slot and the fewest requests outstanding, or None."""
        free = [u for u in self.upstreams if u.has_room and u not in exclude]
        return min(free, key=lambda u: (u.in_flight, u.requests), default=None)

    def any_up(self, exclude: Collection[Upstream] = ()) -> bool:
        return any(u.up and u not in exclude for u in self.upstreams)

    def succeeded(self, upstream: Upstream) -> bool:
        """It answered; True if that brought it back up."""
        came_back = not upstream.up
        upstream.up = True
        upstream.failures_in_a_row = 0
        return came_back

    def failed(self, upstream: Upstream, why: str) -> bool:
        """It failed a request or a health check; True if that marked it down."""
        upstream.last_error = why
        upstream.failures_in_a_row += 1
        if upstream.up and upstream.failures_in_a_row >= self.failures_to_down:
            upstream.up = False
            return True
        return False

    def unavailable(self) -> str | None:
        """Why no request can be served now (None: some upstream is up)."""
        if self.any_up():
            return None
        reasons = ", ".join(f"{u.base_url} ({u.last_error or 'not checked yet'})" for u in self)
        return f"no upstream inference server is up: {reasons}"

    @property
    def capacity(self) -> int:
        return sum(u.capacity for u in self.upstreams if u.up)

    @property
    def in_flight(self) -> int:
        return sum(u.in_flight for u in self.upstreams)
