"""deploy/nginx.conf passes on the bodies the app takes: a conversation exported from the app, close
to the import's 5 MB limit, imports back through the proxy.

The control is the config as it was (`client_max_body_size 1m`): the same import is refused there
by nginx, with its HTML page. Past the app's limit the app's own JSON 413 comes through; past
nginx's larger one, nginx answers 413 in the same JSON shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.domain.chat.archive_schemas import MAX_IMPORT_BYTES
from tests.live_server import PageClient
from tests.ops.harness import AppProcess, Nginx, client_like, proxy_for, sse_reply, start_nginx

TURNS = 3  # six messages, each padded to a sixth of the near-limit size
NEAR_LIMIT = MAX_IMPORT_BYTES - 100_000  # ~4.9 MB: what a long conversation's export weighs
PAD = "Streams carry tokens one by one. Ça marche, 字 and all. "  # multi-byte text included


@pytest.fixture
def proxied(admin: PageClient, good_proxy: Nginx) -> Iterator[PageClient]:
    client = client_like(admin, good_proxy.url)
    try:
        yield client
    finally:
        client.close()


def import_through(client: PageClient, body: bytes) -> httpx.Response:
    return client.post(
        "/api/conversations/import", content=body, headers={"content-type": "application/json"}
    )


def export_json(client: PageClient, conversation_id: str) -> httpx.Response:
    response = client.http.get(f"/api/conversations/{conversation_id}/export?format=json")
    assert response.status_code == 200, response.text
    return response


def padded_export(document: dict[str, Any], size: int) -> bytes:
    """`document` with its messages' texts lengthened so that the file is about `size` bytes."""
    document = json.loads(json.dumps(document))
    base = len(json.dumps(document).encode())
    per_message = (size - base) // len(document["messages"])
    unit = len(PAD.encode())
    for message in document["messages"]:
        message["content"] += PAD * (per_message // unit)
    return json.dumps(document, ensure_ascii=False).encode()


def without_ids(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(m["role"], m["status"], m["content"]) for m in document["messages"]]


def test_an_export_near_the_limit_imports_back_through_nginx(
    proxied: PageClient, streaming_app: AppProcess, good_proxy: Nginx
) -> None:
    conversation = proxied.new_conversation()
    for turn in range(TURNS):
        reply = sse_reply(proxied, conversation, f"Turn {turn} [[synthetic:tokens=3]]")
        assert reply.final is not None and reply.final["status"] == "completed", reply.final
    big = padded_export(export_json(proxied, conversation).json(), NEAR_LIMIT)
    assert NEAR_LIMIT - 50_000 < len(big) <= MAX_IMPORT_BYTES

    imported = import_through(proxied, big)  # through nginx, as a browser behind it would
    assert imported.status_code == 201, imported.text[:500]
    exported = export_json(proxied, imported.json()["id"])  # the app's own file, ~4.9 MB...
    assert len(exported.content) > 4_500_000
    again = import_through(proxied, exported.content)  # ...imports back through the proxy
    assert again.status_code == 201, again.text[:500]
    copy = export_json(proxied, again.json()["id"]).json()
    assert without_ids(copy) == without_ids(json.loads(big))
    assert len(copy["messages"]) == 2 * TURNS

    # The control: the config as it was refuses the same file with nginx's HTML page.
    old_conf = proxy_for("old-1m", (streaming_app, streaming_app), "60s").replace(
        "client_max_body_size 8m;", "client_max_body_size 1m;"
    )
    old = start_nginx("old_1m", old_conf.replace("error_page 413 @body_too_large;", ""))
    try:
        refused = import_through(client_like(proxied, old.url), exported.content)
    finally:
        old.stop()
    assert refused.status_code == 413
    assert "text/html" in refused.headers["content-type"], refused.headers


def test_past_the_apps_limit_the_apps_413_and_past_nginxs_a_json_413(
    proxied: PageClient,
) -> None:
    just_over = import_through(proxied, b" " * (MAX_IMPORT_BYTES + 1))
    assert just_over.status_code == 413
    assert just_over.headers["content-type"].startswith("application/json")
    assert just_over.json()["status_code"] == 413  # the app's answer: nginx passed the body on
    assert "8 MB" not in just_over.text

    far_over = import_through(proxied, b" " * (9 * 1024 * 1024))
    assert far_over.status_code == 413
    assert far_over.headers["content-type"].startswith("application/json"), far_over.text
    body = far_over.json()
    assert body["status_code"] == 413 and "too large" in body["detail"]
