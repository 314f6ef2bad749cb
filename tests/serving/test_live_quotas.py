"""Token quotas (issue 24 item 5) against a real server and the real model, on SQLite and
PostgreSQL: replies started at once stop within one reply of the limit; a send over the limit is
refused with when it resets, on the page's SSE route, the WebSocket and `/v1` (OpenAI's
`insufficient_quota` shape); cancelled and disconnected replies count what the engine used; an
admin's override (admin-only, CSRF-checked, audited) is in force at the user's next send.

Each test signs up a user of its own and gives them limits through the admin API, so the module
shares the pooled default server (no quota by default)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import httpx
from websockets.sync.client import connect

from app.domain.quotas.service import reply_bound
from tests.live_server import LiveServer, PageClient, PageStream, SseReader, query, read_stream
from tests.serving.conftest import unique_email

QUESTION = "Write a short poem about the sea."


def new_user(server: LiveServer) -> tuple[PageClient, str]:
    client = PageClient(server.url)
    return client, client.signup(unique_email("quota"))["id"]


def set_quota(
    admin: PageClient, user_id: str, per_day: int | None, per_month: int | None = None
) -> None:
    response = admin.http.put(
        f"/admin/api/users/{user_id}/quota",
        json={"per_day": per_day, "per_month": per_month},
        headers=admin.csrf_headers(),
    )
    assert response.status_code == 200, response.text


def quota(client: PageClient) -> dict[str, Any]:
    response = client.http.get("/api/quota")
    assert response.status_code == 200, response.text
    return response.json()


REPLIES = (
    "SELECT m.status, m.prompt_tokens, m.completion_tokens FROM messages m"
    " JOIN conversations c ON c.id = m.conversation_id"
    " WHERE m.role = 'assistant' AND c.user_id = (SELECT id FROM users WHERE email = :email)"
)


def replies_of(database_url: str, client: PageClient) -> list[dict[str, Any]]:
    """Every reply of the user, page and API conversations alike, as stored."""
    return query(database_url, REPLIES, email=client.email)


def engine_tokens(message: dict[str, Any]) -> int:
    return (message["prompt_tokens"] or 0) + (message["completion_tokens"] or 0)


def settled(database_url: str, client: PageClient, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The user's replies once none is streaming, and the counter agrees with them."""
    deadline = time.monotonic() + timeout_s
    while True:
        replies = replies_of(database_url, client)
        if all(r["status"] != "streaming" for r in replies):
            if quota(client)["used_day"] == sum(engine_tokens(r) for r in replies):
                return replies
        if time.monotonic() > deadline:
            raise AssertionError(f"not settled: {quota(client)!r} vs {replies!r}")
        time.sleep(0.1)


def test_replies_started_at_once_stop_within_one_reply_of_the_limit(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    carol, carol_id = new_user(server)
    set_quota(alice, carol_id, per_day=300)
    conversations = [carol.new_conversation() for _ in range(8)]  # MAX_REPLIES_PER_USER
    statuses: list[int] = []
    go = threading.Barrier(len(conversations))

    def send(conversation_id: str) -> None:
        client = PageClient(server.url)
        client.http.cookies.update(carol.http.cookies)
        go.wait()
        with client.send(conversation_id, QUESTION, max_tokens=32) as response:
            statuses.append(response.status_code)
            if response.status_code == 200:
                read_stream(response)
            else:
                response.read()
        client.close()

    threads = [threading.Thread(target=send, args=(c,)) for c in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    replies = settled(live_database_url, carol)
    assert sorted(set(statuses)) == [200, 429], statuses  # some got in, the rest were refused
    used = quota(carol)["used_day"]
    biggest = max(engine_tokens(r) for r in replies)
    bound = reply_bound([{"role": "user", "content": QUESTION}], 32, 2048)
    assert biggest <= bound  # what each reserved covers what it used (the premise)
    assert used == sum(engine_tokens(r) for r in replies)  # the engine's usage, nothing else
    assert used < 300 + biggest, (used, [engine_tokens(r) for r in replies])
    # keep going until refused: the total never passes the limit by more than one reply
    while True:
        with carol.send(carol.new_conversation(), QUESTION, max_tokens=32) as response:
            if response.status_code != 200:
                assert response.status_code == 429
                response.read()
                break
            read_stream(response)
    replies = settled(live_database_url, carol)
    used = quota(carol)["used_day"]
    assert 300 <= used < 300 + max(engine_tokens(r) for r in replies)
    carol.close()


def test_over_the_limit_the_page_the_socket_and_v1_say_when_it_resets(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    dave, dave_id = new_user(server)
    set_quota(alice, dave_id, per_day=1)
    conversation = dave.new_conversation()
    with dave.send(conversation, QUESTION, max_tokens=8) as response:  # 0 < 1: admitted
        read_stream(response)
    settled(live_database_url, dave)
    state = quota(dave)
    assert state["per_day"] == 1 and state["left_day"] == 0 and state["low"] is True
    midnight = state["day_resets_at"][:10] + " 00:00 UTC"

    with dave.send(conversation, QUESTION) as refused:  # the page's SSE route
        body = json.loads(refused.read())
    assert refused.status_code == 429
    assert "token quota for this day" in body["detail"] and midnight in body["detail"]
    assert 0 < int(refused.headers["retry-after"]) <= 86_401

    cookie = "; ".join(f"{k}={v}" for k, v in dave.http.cookies.items())
    with connect(server.ws_url, additional_headers={"Cookie": cookie}, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "send", "conversation_id": conversation,
                            "content": QUESTION, "client_ref": "q"}))  # fmt: skip
        frame = json.loads(ws.recv(timeout=15))
        while frame["type"] != "rejected":
            assert frame["type"] in ("ping", "event"), frame
            frame = json.loads(ws.recv(timeout=15))
    assert frame["status"] == 429 and midnight in frame["error"]

    key = dave.post("/api/keys", {"name": "k"}).json()["secret"]
    api = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": _model(server, key),
            "messages": [{"role": "user", "content": QUESTION}],
        },
        timeout=30,
    )
    assert api.status_code == 429
    error = api.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "insufficient_quota",
        "insufficient_quota",
        None,
    )
    assert midnight in error["message"] and int(api.headers["retry-after"]) > 0
    assert (
        len(replies_of(live_database_url, dave)) == 1
    )  # nothing was written for the refused sends
    dave.close()


def _model(server: LiveServer, key: str) -> str:
    models = httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {key}"})
    return models.json()["data"][0]["id"]


def test_cancelled_and_disconnected_replies_count_what_the_engine_used(
    server: LiveServer, alice: PageClient, live_database_url: str
) -> None:
    erin, erin_id = new_user(server)
    set_quota(alice, erin_id, per_day=100_000)
    conversation = erin.new_conversation()
    with erin.send(conversation, "Tell me a very long story.", max_tokens=400) as response:
        reader, record = SseReader(response), PageStream()
        for item in reader:
            if (event := record.add(item)) is not None and event.event == "delta":
                break
        message_id = record.message_id
        assert erin.cancel(message_id).status_code == 200
        read_stream(reader, record)
    stored = erin.wait_final(conversation, message_id)
    assert stored["status"] == "cancelled" and stored["completion_tokens"] < 400

    key = erin.post("/api/keys", {"name": "k"}).json()["secret"]
    with httpx.stream(  # a /v1 stream the client drops after its first chunk: `disconnected`
        "POST",
        f"{server.url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": _model(server, key),
            "stream": True,
            "max_tokens": 400,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
        },
        timeout=30,
    ) as api:
        assert api.status_code == 200
        for line in api.iter_lines():
            if line.startswith("data: {"):
                break
    replies = settled(live_database_url, erin)
    assert sorted(r["status"] for r in replies) == ["cancelled", "disconnected"]
    assert all(engine_tokens(r) > 0 for r in replies)
    erin.close()


def test_an_admins_override_is_guarded_audited_and_in_force_at_once(
    server: LiveServer, alice: PageClient, bob: PageClient, live_database_url: str
) -> None:
    frank, frank_id = new_user(server)
    set_quota(alice, frank_id, per_day=1)
    with frank.send(frank.new_conversation(), QUESTION, max_tokens=8) as response:
        read_stream(response)
    settled(live_database_url, frank)
    with frank.send(frank.new_conversation(), QUESTION) as refused:
        refused.read()
    assert refused.status_code == 429

    path = f"/admin/api/users/{frank_id}/quota"
    body = {"per_day": 0, "per_month": None}
    assert bob.http.put(path, json=body, headers=bob.csrf_headers()).status_code == 403
    assert alice.http.put(path, json=body).status_code == 403  # no CSRF header
    assert (
        alice.http.put(path, json={"per_day": -1}, headers=alice.csrf_headers()).status_code == 400
    )
    form = f"/admin/users/{frank_id}/quota/set"
    no_token = alice.http.post(form, data={"per_day": "0"}, follow_redirects=False)
    assert no_token.status_code == 403
    assert bob.http.post(
        form, data={"per_day": "0", "_csrf_token": bob.csrf_headers()["x-csrftoken"]},
        follow_redirects=False,
    ).status_code in (401, 403)  # fmt: skip
    assert quota(frank)["per_day"] == 1  # none of those changed anything

    token = alice.csrf_headers()["x-csrftoken"]
    done = alice.http.post(
        form, data={"per_day": "0", "per_month": "", "_csrf_token": token}, follow_redirects=False
    )
    assert done.status_code == 303, done.text
    assert quota(frank)["per_day"] is None  # 0: no limit
    with frank.send(frank.new_conversation(), QUESTION, max_tokens=8) as response:
        assert response.status_code == 200  # at once: no cache between the change and the send
        read_stream(response)

    listed = alice.http.get("/admin/api/users", params={"q": frank.email}).json()["users"][0]
    assert listed["quota_per_day"] == 0 and listed["quota_used_day"] == quota(frank)["used_day"]
    page = alice.http.get("/admin/users", params={"q": frank.email})
    assert "quota-form" in page.text
    entries = alice.http.get("/admin/api/audit", params={"action": "quota", "who": frank.email})
    details = [json.loads(e["detail"]) for e in entries.json()["entries"]]
    assert details[0]["after"] == {"per_day": 0, "per_month": None}
    assert details[-1] == {"before": {"per_day": None, "per_month": None},
                           "after": {"per_day": 1, "per_month": None}}  # fmt: skip
    with contextlib.suppress(Exception):
        frank.close()
