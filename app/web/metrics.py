"""`GET /metrics` in Prometheus' text format."""

from __future__ import annotations

from litestar import Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.streaming.metrics import REGISTRY


@get("/metrics", include_in_schema=False, sync_to_thread=False)
def metrics_endpoint() -> Response[bytes]:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
