"""Prometheus metrics of the streaming path, engine-side and as delivered to clients.

The gap between the engine's histograms and the delivered ones is the serving path's own cost
(queueing in the app, framing, a slow socket); a delivered TTFT far above the engine's says
something between the engine and the user is buffering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from app.engine.base import BackendStats, EngineStats, PrefixCacheStats
from app.streaming.loop_histogram import LoopHistogram

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip

ENGINE_TTFT = Histogram(
    "streamchat_engine_ttft_seconds",
    "Time from enqueue to the engine's first token.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
ENGINE_GAP = LoopHistogram(
    "streamchat_engine_inter_token_seconds",
    "Gap between consecutive text deltas as they leave the engine.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "streamchat_queue_wait_seconds",
    "Time a request waited before the engine admitted it.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DELIVERED_TTFT = LoopHistogram(
    "streamchat_delivered_ttft_seconds",
    "Time from the request to the first text handed to the client's connection.",
    ["transport"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DELIVERED_GAP = LoopHistogram(
    "streamchat_delivered_gap_seconds",
    "Gap between consecutive events handed to a client's connection.",
    ["transport"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
REPLIES = Counter(
    "streamchat_replies_total", "Replies by end state.", ["status"], registry=REGISTRY
)
ABORTS = Counter("streamchat_aborts_total", "Engine aborts by cause.", ["cause"], registry=REGISTRY)
DEADLINE_ABORTS = Counter(
    "streamchat_deadline_aborts_total",
    "Subscribers given up on because they took nothing for the deadline while text was pending.",
    registry=REGISTRY,
)
COALESCED = Counter(
    "streamchat_coalesced_deltas_total",
    "Engine deltas that left merged into a larger event (the client was still busy, or the "
    "delivery tick held them).",
    ["transport"],
    registry=REGISTRY,
)
DELIVERY_TICK = Gauge(
    "streamchat_delivery_tick_seconds",
    "How long new text waits to be sent, so that it leaves merged (0: at once; the event loop "
    "is keeping up). See app/streaming/pacing.py.",
    registry=REGISTRY,
)
OPEN_STREAMS = Gauge(
    "streamchat_open_streams", "Open reply streams by transport.", ["transport"], registry=REGISTRY
)

FINAL_SAVES_PENDING = Gauge(
    "streamchat_final_saves_pending",
    "Replies that have ended but whose end state is not saved yet (held in memory, retried).",
    registry=REGISTRY,
)
FINAL_SAVE_FAILURES = Counter(
    "streamchat_final_save_failures_total",
    "Failed attempts to save a reply's end state (each one is retried until it succeeds).",
    registry=REGISTRY,
)
FLUSH_FAILURES = Counter(
    "streamchat_flush_failures_total",
    "Failed batched flushes of partial replies (the next tick retries).",
    registry=REGISTRY,
)
DATABASE_REFUSING_WRITES = Gauge(
    "streamchat_database_refusing_writes",
    "1 while the database refuses writes for want of storage (disk full, or read-only), by kind.",
    ["kind"],
    registry=REGISTRY,
)


def storage_changed(kind: str | None) -> None:
    """`StorageHealth.on_change` (app/db/storage.py): the gauge above follows it."""
    for each in ("full", "read-only"):
        DATABASE_REFUSING_WRITES.labels(kind=each).set(1 if kind == each else 0)


storage_changed(None)  # both series exist, at 0, from the first scrape


class EngineCollector(Collector):
    """Reads the engine's own counters at scrape time (no polling loop)."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats.backends:
            yield from backend_metrics(stats.backends)
        for name, doc, value in (
            ("streamchat_engine_running_sequences", "Sequences decoding now.", stats.running),
            (
                "streamchat_engine_waiting_sequences",
                "Requests waiting for admission.",
                stats.waiting,
            ),
            ("streamchat_engine_kv_cells_used", "KV cache cells in use.", stats.kv_used),
            ("streamchat_engine_kv_cells_total", "KV cache cells in all.", stats.kv_total),
            ("streamchat_engine_steps", "Engine steps since start.", stats.steps),
            (
                "streamchat_engine_tokens_generated",
                "Tokens sampled since start.",
                stats.tokens_generated,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        if stats.kv_walked is not None:
            yield GaugeMetricFamily(
                "streamchat_engine_kv_cells_walked",
                "KV cells each query of the last step read (a unified pool's attention walks up to"
                " its highest occupied cell).",
                value=stats.kv_walked,
            )
        if (cache := stats.prefix_cache) is not None:
            yield from prefix_cache_metrics(cache)


def prefix_cache_metrics(cache: PrefixCacheStats) -> Iterator[Metric]:
    """The engine's cache of earlier prompts (per owner: a user's prefix serves only them)."""
    for name, doc, value in (
        (
            "streamchat_prefix_cache_hits",
            "Admissions that started from a cached prefix.",
            cache.hits,
        ),
        ("streamchat_prefix_cache_misses", "Admissions that found no cached prefix.", cache.misses),
        (
            "streamchat_prefix_cache_reused_tokens",
            "Prompt tokens not prefilled thanks to the cache.",
            cache.reused_tokens,
        ),
    ):
        yield CounterMetricFamily(name, doc, value=value)
    yield GaugeMetricFamily(
        "streamchat_prefix_cache_entries", "Prefixes the cache holds.", value=cache.entries
    )
    yield GaugeMetricFamily(
        "streamchat_prefix_cache_host_bytes",
        "Host memory the cache's saved states take (ENGINE_PREFIX_CACHE_MB bounds it).",
        value=cache.host_bytes,
    )


def backend_metrics(backends: tuple[BackendStats, ...]) -> Iterator[Metric]:
    """Per-upstream figures of an engine that sends requests to other servers (ENGINE=openai)."""
    label = ["upstream"]
    up = GaugeMetricFamily("streamchat_upstream_up", "1 if the upstream is up.", labels=label)
    in_flight = GaugeMetricFamily(
        "streamchat_upstream_in_flight", "Requests the upstream serves now.", labels=label
    )
    slots = GaugeMetricFamily(
        "streamchat_upstream_slots", "Requests it is sent at once at most.", labels=label
    )
    requests = CounterMetricFamily(
        "streamchat_upstream_requests", "Requests sent to the upstream.", labels=label
    )
    errors = CounterMetricFamily(
        "streamchat_upstream_errors", "Requests the upstream failed or refused.", labels=label
    )
    ttft = HistogramMetricFamily(
        "streamchat_upstream_ttft_seconds",
        "Time from sending a request to the upstream to its first text.",
        labels=label,
    )
    for b in backends:
        up.add_metric([b.name], 1.0 if b.up else 0.0)
        in_flight.add_metric([b.name], b.in_flight)
        slots.add_metric([b.name], b.capacity)
        requests.add_metric([b.name], b.requests)
        errors.add_metric([b.name], b.errors)
        buckets = [(f"{bound:g}", count) for bound, count in b.ttft_buckets]
        ttft.add_metric([b.name], [*buckets, ("+Inf", b.ttft_count)], sum_value=b.ttft_sum_s)
    yield from (up, in_flight, slots, requests, errors, ttft)


_engine_collector: EngineCollector | None = None


def watch_engine(stats: Callable[[], EngineStats]) -> None:
    """Expose this engine's stats (replacing a previous engine's, e.g. in tests)."""
    global _engine_collector
    if _engine_collector is not None:
        REGISTRY.unregister(_engine_collector)
    _engine_collector = EngineCollector(stats)
    REGISTRY.register(_engine_collector)
