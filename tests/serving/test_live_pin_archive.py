"""Pinning and archiving over HTTP (issue 22, item 8), against a real server on SQLite and
PostgreSQL: `PATCH /api/conversations/{id}` with `pinned` / `archived`, the list and its keyed
pages across the pinned/unpinned boundary (`after_pinned`), the archived view, search and export
of an archived conversation, a send that brings it back, the user's other page told of each
change; CSRF, another user's 404."""

from __future__ import annotations

from typing import Any

import pytest

from tests.live_server import LiveServer, PageClient, SseReader, read_stream
from tests.serving.test_live_push import sse_channel


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


def patch(client: PageClient, conversation: str, body: dict[str, Any], **kwargs: Any) -> Any:
    headers = kwargs.pop("headers", client.csrf_headers())
    return client.http.patch(f"/api/conversations/{conversation}", json=body, headers=headers)


def listed(client: PageClient, **params: Any) -> list[dict[str, Any]]:
    response = client.http.get("/api/conversations", params={"limit": 500, **params})
    assert response.status_code == 200, response.text
    return response.json()


def filed_event(conversation: dict[str, Any]) -> dict[str, Any]:
    return {
        "event": "conversation_filed",
        "conversation_id": conversation["id"],
        **{k: conversation[k] for k in ("title", "updated_at", "pinned_at", "archived_at")},
    }


def test_pin_archive_search_export_and_a_send_that_brings_it_back(
    server: LiveServer, alice: PageClient
) -> None:
    first, second, third = (alice.new_conversation() for _ in range(3))
    with sse_channel(server, alice) as other_tab:
        pinned = patch(alice, first, {"pinned": True})
        assert pinned.status_code == 200, pinned.text
        assert pinned.json()["pinned_at"] and pinned.json()["archived_at"] is None
        assert other_tab.next_event() == filed_event(pinned.json())
        assert [c["id"] for c in listed(alice)][:3] == [first, third, second]

        patch(alice, second, {"title": "Dragons and their hoards"}).raise_for_status()
        archived = patch(alice, second, {"archived": True})
        assert archived.status_code == 200, archived.text
        assert archived.json()["archived_at"] and archived.json()["title"].startswith("Dragons")
        assert other_tab.next_event()["event"] == "conversation_renamed"
        assert other_tab.next_event() == filed_event(archived.json())
        assert second not in [c["id"] for c in listed(alice)]
        assert [c["id"] for c in listed(alice, archived="true")] == [second]

        # Still found, opened and exported; search marks it archived.
        hits = alice.http.get("/api/conversations/search", params={"q": "hoards"}).json()
        assert [(h["conversation_id"], h["archived"]) for h in hits] == [(second, True)]
        assert alice.conversation(second)["archived_at"] == archived.json()["archived_at"]
        exported = alice.http.get(f"/api/conversations/{second}/export?format=json")
        assert exported.status_code == 200 and exported.json()["conversation"]["title"]
        # The admin (alice is the server's first sign-up) sees the flags.
        admin_view = alice.http.get(f"/admin/conversations/{second}")
        assert admin_view.status_code == 200 and 'data-testid="admin-archived"' in admin_view.text
        admin_list = alice.http.get("/admin", params={"q": "hoards"})
        assert 'data-testid="admin-archived"' in admin_list.text, admin_list.text[-2000:]

        # Archiving the pinned one unpins it; pinning an archived one brings it back.
        moved = patch(alice, first, {"archived": True}).json()
        assert moved["pinned_at"] is None and moved["archived_at"]
        assert other_tab.next_event() == filed_event(moved)
        back = patch(alice, first, {"pinned": True}).json()
        assert back["pinned_at"] and back["archived_at"] is None
        assert other_tab.next_event() == filed_event(back)

        # A send into the archived one brings it back to the list (on top of the unpinned).
        with alice.send(second, "Still here? [[synthetic:tokens=3]]") as sent:
            assert sent.status_code == 200
            stream = read_stream(SseReader(sent))
        assert stream.end is not None
        assert [c["id"] for c in listed(alice)][:3] == [first, second, third]
        assert listed(alice, archived="true") == []
        assert alice.conversation(second)["archived_at"] is None
        assert other_tab.next_event()["event"] == "reply_started"  # the page's cue to move it

        # A PATCH that changes nothing answers the conversation as it is, and tells nobody.
        same = patch(alice, third, {})
        assert same.status_code == 200 and same.json()["id"] == third
        assert [e["event"] for e in other_tab.events_within(0.5)] == ["reply_ended"]


def test_pages_cross_the_pinned_boundary_over_http(alice: PageClient) -> None:
    for earlier in listed(alice):  # the other tests' pins
        if earlier["pinned_at"]:
            patch(alice, earlier["id"], {"pinned": False}).raise_for_status()
    made = [alice.new_conversation() for _ in range(12)]
    for conversation in made[2:7]:
        patch(alice, conversation, {"pinned": True}).raise_for_status()
    for conversation in made[7:9]:
        patch(alice, conversation, {"archived": True}).raise_for_status()
    everything = listed(alice)
    assert [c["id"] for c in everything[:5]] == list(reversed(made[2:7]))
    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"limit": 4}
    while True:
        page = alice.http.get("/api/conversations", params=params).json()
        pages.append(page)
        if len(page) < 4:
            break
        last = page[-1]
        params = {"limit": 4, "after": last["updated_at"], "after_id": last["id"]}
        if last["pinned_at"]:
            params["after_pinned"] = last["pinned_at"]
    assert [c for p in pages for c in p] == everything
    archived = alice.http.get("/api/conversations", params={"archived": "true", "limit": 1}).json()
    last = archived[-1]
    rest = alice.http.get(
        "/api/conversations",
        params={"archived": "true", "after": last["updated_at"], "after_id": last["id"]},
    ).json()
    assert [c["id"] for c in archived + rest][:2] == [made[8], made[7]]


def test_csrf_owner_and_bad_requests(alice: PageClient, bob: PageClient) -> None:
    conversation = alice.new_conversation()
    no_csrf = alice.http.patch(f"/api/conversations/{conversation}", json={"pinned": True})
    assert no_csrf.status_code == 403, no_csrf.text
    for body in ({"pinned": True}, {"archived": True}, {"title": "mine now"}):
        foreign = patch(bob, conversation, body)
        assert foreign.status_code == 404, foreign.text
    mine = alice.conversation(conversation)
    assert mine["pinned_at"] is None and mine["archived_at"] is None
    assert conversation not in [c["id"] for c in listed(bob, archived="true")]

    both = patch(alice, conversation, {"pinned": True, "archived": True})
    assert both.status_code == 400, both.text
    assert patch(alice, conversation, {"pinned": "yes"}).status_code == 400
    missing = "00000000-0000-4000-8000-000000000000"
    assert patch(alice, missing, {"archived": True}).status_code == 404
    assert alice.conversation(conversation)["pinned_at"] is None  # the 400 wrote nothing
