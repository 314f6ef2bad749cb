"""The upstream servers of ENGINE=openai: which one takes the next request, and which are up.

Pure bookkeeping (the engine does the HTTP): each `Upstream` counts what it is serving and how it
fared; `UpstreamPool.pick` chooses among those that are up and have a free slot, first those whose
last request produced tokens, then the one with the fewest requests outstanding (ties: the one sent
fewest so far, so an idle pair takes turns).

Health checks and requests are counted apart: a wedged inference server may still answer its
health check while no request gets a token, so a good probe must not wipe out the failed requests.
`failures_to_down` failed checks in a row, or as many failed requests in a row (first-token
timeouts included), mark an upstream down. What brings it back is a successful health check
(app/engine/openai/health.py), never a request: a down upstream is sent nothing. One brought back
after failed requests is still suspect: it gets a request only when the others are full, one at a
time, and its next failed request marks it down again; its first token clears it.
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
    up: bool = False  # until a health check says otherwise
    # What serves there, as its `GET /models` says (`owned_by`: "llamacpp", "vllm", "sglang",
    # "tensorrt_llm"; "" until known): which sampling fields it takes (sampling.py)
    server: str = ""
    has_health: bool | None = None  # whether it offers `GET /health` (None: not asked yet)
    in_flight: int = 0
    probe_failures: int = 0  # health checks failed in a row
    request_failures: int = 0  # requests failed in a row; a token from it clears the count
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
        # A suspect upstream (its last request failed) is tried one request at a time.
        return self.up and self.in_flight < (1 if self.request_failures else self.capacity)

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
        """The up upstream with a free slot, producing tokens rather than failing requests, and
        the fewest requests outstanding; or None."""
        free = [u for u in self.upstreams if u.has_room and u not in exclude]
        return min(
            free, key=lambda u: (u.request_failures > 0, u.in_flight, u.requests), default=None
        )

    def any_up(self, exclude: Collection[Upstream] = ()) -> bool:
        return any(u.up and u not in exclude for u in self.upstreams)

    def probe_succeeded(self, upstream: Upstream) -> bool:
        """It passed a health check; True if that brought it back up."""
        came_back = not upstream.up
        upstream.up = True
        upstream.probe_failures = 0
        return came_back

    def probe_failed(self, upstream: Upstream, why: str) -> bool:
        """It failed a health check; True if that marked it down."""
        upstream.probe_failures += 1
        return self._count(upstream, why, upstream.probe_failures)

    def producing(self, upstream: Upstream) -> None:
        """A request of it got tokens: it serves, it is no longer suspect."""
        upstream.request_failures = 0

    def request_failed(self, upstream: Upstream, why: str) -> bool:
        """A request of it failed (or got no first token in time); True if that marked it down."""
        upstream.request_failures += 1
        return self._count(upstream, why, upstream.request_failures)

    def _count(self, upstream: Upstream, why: str, in_a_row: int) -> bool:
        upstream.last_error = why
        if upstream.up and in_a_row >= self.failures_to_down:
            upstream.up = False
            return True
        return False

    def degraded(self) -> str | None:
        """Which upstreams are down while others serve (None: all up, or none: `unavailable`)."""
        down = [u for u in self.upstreams if not u.up]
        if not down or len(down) == len(self.upstreams):
            return None
        reasons = ", ".join(f"{u.base_url} ({u.last_error or 'not checked yet'})" for u in down)
        return f"{len(down)} of {len(self.upstreams)} upstreams down: {reasons}"

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
