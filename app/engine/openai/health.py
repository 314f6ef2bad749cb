"""Health checks of ENGINE=openai's upstreams, and what they tell of the model and the server.

Every `interval_s` each upstream gets `GET /models` (every OpenAI-compatible server has it) and,
where the server offers one, `GET /health` at its root: an inference server that has hung or lost
its engine may still list its models, but its health endpoint says so (vLLM's `/health` asks the
engine core, vllm/entrypoints/openai/api_server.py `health`; trtllm-serve's, in recent releases,
whether its LLM is alive, tensorrt_llm/serve/openai_server.py `health`; llama-server's answers 503
while it loads, tools/server/server.cpp). A 404 there means none is offered: `/models` alone decides. An answer
marks the upstream up; a failure counts towards marking it down (`UpstreamPool.probe_failed`), so a
down upstream comes back on its own once it answers.

`/models` also names the server (`owned_by`, which picks the sampling fields' names:
app/engine/openai/sampling.py), the model (the first listed) and its context (llama-server:
`meta.n_ctx`, tools/server/server-context.cpp `get_res_model_info`; vLLM: `max_model_len`), and
llama-server's `/props` its slots (`total_slots`, the requests it serves at once), read at every
check: a server restarted with fewer slots is sent no more than it has.
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
            response = await self._get(f"{upstream.base_url}/models")
            response.raise_for_status()
            models = response.json().get("data") or []
            if models:
                upstream.server = str(models[0].get("owned_by") or "")
            await self._check_health(upstream)
            if self._discover_slots and upstream.server == "llamacpp":
                await self._read_slots(upstream)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if self._pool.probe_failed(upstream, f"health check: {describe(exc)}"):
                log.warning("upstream %s marked down: %s", upstream.base_url, describe(exc))
                self._on_change()
            return
        if models and self.model is None:
            self.model = _model_info(models[0])
        if self._pool.probe_succeeded(upstream):
            log.info("upstream %s is up (%d slots)", upstream.base_url, upstream.capacity)
            self._on_change()

    async def _get(self, url: str) -> httpx.Response:
        return await self._client.get(url, timeout=self._timeout_s)

    async def _check_health(self, upstream: Upstream) -> None:
        """Its `GET /health`, where it has one; raises when that says it cannot serve."""
        if upstream.has_health is False:
            return
        response = await self._get(f"{upstream.root}/health")
        if response.status_code in (404, 405) and upstream.has_health is None:
            upstream.has_health = False  # not offered: `/models` answering is all there is
            return
        upstream.has_health = True
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"GET /health answered {response.status_code}: {response.text[:200]}",
                request=response.request,
                response=response,
            )

    async def _read_slots(self, upstream: Upstream) -> None:
        response = await self._get(f"{upstream.root}/props")
        slots = response.json().get("total_slots") if response.status_code == 200 else None
        if isinstance(slots, int) and slots > 0 and slots != upstream.capacity:
            log.info(
                "upstream %s has %d slots (was %d)", upstream.base_url, slots, upstream.capacity
            )
            upstream.capacity = slots
            self._on_change()  # more room: the waiting may go


def _model_info(model: dict[str, Any]) -> ModelInfo:
    meta = model.get("meta") or {}
    context = meta.get("n_ctx") or model.get("max_model_len")
    return ModelInfo(
        name=str(model.get("id") or ""),
        context=context if isinstance(context, int) and context > 0 else None,
    )
