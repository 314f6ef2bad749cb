"""`GET /metrics` in Prometheus' text format.

With `METRICS_TOKEN` set, only a scraper that sends `Authorization: Bearer <token>` gets them
(Prometheus: `authorization: {credentials: <token>}` in the scrape config); without it they are
open to whoever reaches the replica's port, and the shipped nginx config hides them either way.
"""

from __future__ import annotations

import hmac

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.streaming.metrics import REGISTRY


def _authorized(request: Request) -> bool:
    token: str | None = request.app.state.metrics_token
    if token is None:
        return True
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


@get("/metrics", include_in_schema=False, sync_to_thread=False)
def metrics_endpoint(request: Request) -> Response[bytes]:
    if not _authorized(request):
        return Response(
            b"metrics need Authorization: Bearer <METRICS_TOKEN>\n",
            status_code=401,
            media_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
