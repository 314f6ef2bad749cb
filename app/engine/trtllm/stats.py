"""TensorRT-LLM's iteration stats, polled in the background, as the numbers of `EngineStats`.

Queue depth and KV use come from TensorRT-LLM's iteration stats (the LLM is built with
`enable_iter_perf_stats`), polled once a request has been made: it has none before. That queue is
shared (whoever reads a stat consumes it), so nothing else in the process may read it. An idle
executor runs no iterations and so reports nothing (py_executor.py waits for requests): its last
stat shows the last batch still running, so while nothing is in TensorRT-LLM the queue and the KV
use are 0, not the last figures read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from app.engine.base import EngineStats

log = logging.getLogger(__name__)

STATS_POLL_S = 1.0


class IterationStats:
    """The latest iteration stats TensorRT-LLM reported (0s until it reports any)."""

    def __init__(self) -> None:
        self.requested = False  # a request has been made: iteration stats exist
        self._latest: dict[str, float] = {}

    async def poll(self, current_llm: Callable[[], Any]) -> None:
        """Keep the latest iteration stats of whichever LLM runs now (a dead one is replaced),
        polling for as long as the engine runs once a request has been made."""
        failing = False
        while True:
            await asyncio.sleep(STATS_POLL_S)
            llm = current_llm()
            if not self.requested or llm is None:
                continue
            try:
                async for stat in llm.get_stats_async(timeout=STATS_POLL_S):
                    self._record(json.loads(stat) if isinstance(stat, str) else stat)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:  # once, not every second
                    log.info("TensorRT-LLM iteration stats unavailable, reporting 0s: %r", exc)
                failing = True

    def _record(self, stat: dict[str, Any]) -> None:
        kv = stat.get("kvCacheStats") or {}
        fields = {
            "iter": stat.get("iter"),
            "iter_latency_ms": stat.get("iterLatencyMS"),
            "active": stat.get("numActiveRequests"),
            "queued": stat.get("numQueuedRequests"),
            "used_blocks": kv.get("usedNumBlocks"),
            "max_blocks": kv.get("maxNumBlocks"),
            "tokens_per_block": kv.get("tokensPerBlock"),
        }
        self._latest.update({k: float(v) for k, v in fields.items() if v is not None})

    def engine_stats(
        self,
        *,
        running: int,
        waiting: int,
        idle: bool,
        tokens: int,
        extra: dict[str, float],
        unavailable: str | None,
    ) -> EngineStats:
        """`EngineStats` from the latest iteration (0s while `idle`: nothing in TensorRT-LLM),
        with our own counts and `extra` added; `waiting` adds TensorRT-LLM's queue to ours."""
        latest = self._latest
        block = latest.get("tokens_per_block", 0.0)
        busy = 0.0 if idle else 1.0
        for ours, theirs in (
            ("iter_latency_ms", "iter_latency_ms"),
            ("trt_active_requests", "active"),
            ("trt_kv_used_blocks", "used_blocks"),
        ):
            if theirs in latest:
                extra[ours] = latest[theirs] * (busy if theirs != "iter_latency_ms" else 1.0)
        return EngineStats(
            running=running,
            waiting=waiting + int(latest.get("queued", 0) * busy),
            kv_used=int(latest.get("used_blocks", 0) * block * busy),
            kv_total=int(latest.get("max_blocks", 0) * block),
            steps=int(latest.get("iter", 0)),
            tokens_generated=tokens,
            extra=extra,
            unavailable=unavailable,
        )
