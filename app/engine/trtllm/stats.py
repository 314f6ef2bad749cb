"""TensorRT-LLM's iteration stats, polled in the background, as the numbers of `EngineStats`.

Queue depth and KV use come from TensorRT-LLM's iteration stats (the LLM is built with
`enable_iter_perf_stats`), polled once a request has been made: it has none before. That queue is
shared (whoever reads a stat consumes it), so nothing else in the process may read it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from app.engine.base import EngineStats

log = logging.getLogger(__name__)

STATS_POLL_S = 1.0


class IterationStats:
    """The latest iteration stats TensorRT-LLM reported (0s until it reports any)."""

    def __init__(self) -> None:
        self.requested = False  # a request has been made: iteration stats exist
        self._latest: dict[str, float] = {}

    async def poll(self, llm: Any) -> None:
        """Keep the latest iteration stats, polling for as long as the engine runs once a request
        has been made (TensorRT-LLM has none before): the last iterations before the executor goes
        idle are the ones that show the queue and the KV cache emptied."""
        while True:
            await asyncio.sleep(STATS_POLL_S)
            if not self.requested:
                continue
            try:
                async for stat in llm.get_stats_async(timeout=STATS_POLL_S):
                    self._record(json.loads(stat) if isinstance(stat, str) else stat)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("TensorRT-LLM iteration stats unavailable, reporting 0s: %r", exc)
                return

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

    def engine_stats(self, running: int, tokens: int, extra: dict[str, float]) -> EngineStats:
        """`EngineStats` from the latest iteration, with our own counts and `extra` added."""
        latest = self._latest
        block = latest.get("tokens_per_block", 0.0)
        for ours, theirs in (
            ("iter_latency_ms", "iter_latency_ms"),
            ("trt_active_requests", "active"),
            ("trt_kv_used_blocks", "used_blocks"),
        ):
            if theirs in latest:
                extra[ours] = latest[theirs]
        return EngineStats(
            running=running,
            waiting=int(latest.get("queued", 0)),
            kv_used=int(latest.get("used_blocks", 0) * block),
            kv_total=int(latest.get("max_blocks", 0) * block),
            steps=int(latest.get("iter", 0)),
            tokens_generated=tokens,
            extra=extra,
        )
