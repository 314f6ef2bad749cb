"""Health checks of ENGINE=openai's upstreams, and what they tell of the model.

Every `interval_s` each upstream gets `GET /models` (every OpenAI-compatible server has it): an
answer marks it up, a failure counts towards marking it down (`UpstreamPool.failed`), so a down
upstream comes back on its own once it answers. The first answers also name the model (the first
listed) and its context (llama-server: `meta.n_ctx`, tools/server/server-context.cpp
`get_res_model_info`; vLLM: `max_model_len`), and llama-server's `/props` its slots
(`total_slots`, the requests it serves at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from app.engine.openai.upstreams import Upstream, UpstreamPool

log = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    context: int | None  # tokens one request may hold, where the server says


class HealthChecks:
    def __init__(
        self,
        client: httpx.AsyncClient,
        pool: UpstreamPool,
        *,
        timeout_s: float,
        discover_slots: bool,
        on_change: Callable[[], None],
    ) -> None:
        self._client = client
        self._pool = pool
        self._timeout_s = timeout_s
        self._discover_slots = discover_slots
        self._on_change = on_change  # an upstream went up or down: the queue may move
        self.model: ModelInfo | None = None

    async def run_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(u) for u in self._pool))

    async def check(self, upstream: Upstream) -> None:
        try:
            response = await self._client.get(
                f"{upstream.base_url}/models", timeout=self._timeout_s
            )
            response.raise_for_status()
            models = response.json().get("data") or []
            if self._discover_slots and upstream.requests == 0:
                await self._read_slots(upstream)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if self._pool.failed(upstream, f"health check: {describe(exc)}"):
                log.warning("upstream %s marked down: %s", upstream.base_url, describe(exc))
                self._on_change()
            return
        if models and self.model is None:
            self.model = _model_info(models[0])
        if self._pool.succeeded(upstream):
            log.info("upstream %s is up (%d slots)", upstream.base_url, upstream.capacity)
            self._on_change()

    async def _read_slots(self, upstream: Upstream) -> None:
        try:
            response = await self._client.get(f"{upstream.root}/props", timeout=self._timeout_s)
            slots = response.json().get("total_slots") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # not llama-server: the configured count stays
        if isinstance(slots, int) and slots > 0:
            upstream.capacity = slots


def _model_info(model: dict[str, Any]) -> ModelInfo:
    meta = model.get("meta") or {}
    context = meta.get("n_ctx") or model.get("max_model_len")
    return ModelInfo(
        name=str(model.get("id") or ""),
        context=context if isinstance(context, int) and context > 0 else None,
    )
