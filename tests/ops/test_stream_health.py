"""Stream health: the TTFT a client saw, reported back, exposes a buffering proxy.

The page measures its own time to first token (first delta's arrival minus the send) and POSTs it
to /api/messages/{id}/client-metrics; the server stores it as client_ttft_ms next to the engine's
ttft_ms. Through deploy/nginx.conf the two are close; through the buffering control the client's
is the whole reply's length, which the admin console flags (GET /admin/api/messages/{id} has a
`stream_health_warning` sentence, null when healthy).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.live_server import PageClient, query
from tests.ops.harness import Arrivals, Database, Nginx, client_like, sse_reply

REPLY = "How healthy is this stream? [[synthetic:tokens=80]]"  # 2.4 s at 30 ms a token


def stream_health_warning(ttft_ms: float, client_ttft_ms: float) -> bool:
    """The admin console's rule: the client waited much longer than the engine took."""
    return client_ttft_ms - ttft_ms > max(500.0, 3.0 * ttft_ms)


def reply_and_report(client: PageClient, database: Database) -> tuple[Arrivals, dict[str, Any]]:
    """Send a message, time its first delta, report that as the client's TTFT; the stored row."""
    conversation = client.new_conversation()
    arrivals = sse_reply(client, conversation, REPLY)
    assert arrivals.final is not None and arrivals.final["status"] == "completed", arrivals.final
    message_id = arrivals.final["message_id"]
    response = client.post(
        f"/api/messages/{message_id}/client-metrics", {"ttft_ms": arrivals.ttft_ms}
    )
    assert response.status_code == 204, response.text
    stored = client.message(conversation, message_id)
    if "client_ttft_ms" not in stored:  # the page API does not show it (yet): read the row
        rows = query(
            database.async_url,
            "SELECT client_ttft_ms FROM messages WHERE id = :id",
            id=message_id,
        )
        stored["client_ttft_ms"] = rows[0]["client_ttft_ms"]
    return arrivals, stored


def admin_warning(admin: PageClient, message_id: str) -> str | None:
    """The admin console's `stream_health_warning` for a reply: a sentence, or null when healthy."""
    response = admin.http.get(f"/admin/api/messages/{message_id}")
    assert response.status_code == 200, response.text
    return response.json()["stream_health_warning"]


@pytest.mark.parametrize("proxy", ["good_proxy", "buffering_proxy"])
def test_client_ttft_is_stored_next_to_the_engines_and_tells_a_buffering_proxy_apart(
    proxy: str, admin: PageClient, streaming_db: Database, request: pytest.FixtureRequest
) -> None:
    nginx: Nginx = request.getfixturevalue(proxy)
    client = client_like(admin, nginx.url)
    try:
        arrivals, stored = reply_and_report(client, streaming_db)
    finally:
        client.close()
    engine_ms, client_ms = stored["ttft_ms"], stored["client_ttft_ms"]
    print(
        f"\n{proxy}: engine TTFT {engine_ms:.0f} ms, client TTFT {client_ms:.0f} ms, "
        f"difference {client_ms - engine_ms:.0f} ms"
    )
    assert client_ms == pytest.approx(arrivals.ttft_ms, abs=0.01)
    assert 0 < engine_ms < client_ms  # the engine made the token before the client saw it
    buffered = proxy == "buffering_proxy"
    if buffered:  # the buffering proxy held the first token for most of the reply
        reply_ms = (arrivals.final_at - arrivals.sent_at) * 1000.0  # type: ignore[operator]
        assert client_ms - engine_ms > reply_ms / 2
    # ...and only it crosses the admin console's threshold, whatever the load
    assert stream_health_warning(engine_ms, client_ms) is buffered
    warning = admin_warning(admin, stored["id"])
    print(f"admin stream_health_warning: {warning}")
    if buffered:
        assert warning and "buffering" in warning, warning
    else:
        assert warning is None
