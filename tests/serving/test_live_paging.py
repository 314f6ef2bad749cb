"""`GET /api/conversations/{id}` pages the branch shown (issue 22, item 9): the newest page by
default, in the shape it always had (plus `earlier`), and the pages before a message on request."""

from __future__ import annotations

import uuid

import pytest

from tests.live_server import PageClient
from tests.long_conversation import long_export

MESSAGES = 250


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


def test_a_long_conversation_comes_a_page_at_a_time(alice: PageClient, bob: PageClient) -> None:
    imported = alice.post("/api/conversations/import", long_export(MESSAGES))
    assert imported.status_code == 201, imported.text
    conversation = imported.json()["id"]
    path = f"/api/conversations/{conversation}"

    everything = alice.http.get(path, params={"limit": 500}).json()
    assert len(everything["messages"]) == MESSAGES and everything["earlier"] == 0

    first = alice.conversation(conversation)  # no parameters: the newest page
    assert set(first) == set(everything) and first["title"] == everything["title"]
    assert first["messages"] == everything["messages"][-100:] and first["earlier"] == 150

    pages, page = [first["messages"]], first
    while page["earlier"]:
        before = page["messages"][0]["id"]
        page = alice.http.get(path, params={"before": before, "limit": 100}).json()
        pages.insert(0, page["messages"])
    assert [len(p) for p in pages] == [50, 100, 100]
    assert [m for p in pages for m in p] == everything["messages"]

    gone = alice.http.get(path, params={"before": str(uuid.uuid4())})
    assert gone.status_code == 409, gone.text  # not on the branch shown: reload
    assert alice.http.get(path, params={"limit": 0}).status_code == 400
    assert alice.http.get(path, params={"limit": 501}).status_code == 400
    assert bob.http.get(path).status_code == 404


def test_the_conversation_list_comes_a_page_at_a_time(alice: PageClient) -> None:
    for _ in range(120):
        alice.new_conversation()
    everything = alice.http.get("/api/conversations", params={"limit": 500}).json()
    assert len(everything) >= 120
    first = alice.http.get("/api/conversations").json()
    assert first == everything[:100]  # no parameters: the newest 100, as before

    pages, page = [first], first
    while len(page) == 50 or page is first:
        last = page[-1]
        params = {"after": last["updated_at"], "after_id": last["id"], "limit": 50}
        page = alice.http.get("/api/conversations", params=params).json()
        pages.append(page)
    listed = [c for p in pages for c in p]
    assert listed == everything

    # A conversation that moves to the top meanwhile shifts no page.
    alice.http.patch(
        f"/api/conversations/{everything[-1]['id']}",
        json={"title": "moved up"},
        headers=alice.csrf_headers(),
    ).raise_for_status()
    last = first[-1]
    params = {"after": last["updated_at"], "after_id": last["id"], "limit": 500}
    rest = alice.http.get("/api/conversations", params=params).json()
    assert [c["id"] for c in rest] == [c["id"] for c in everything[100:-1]]

    half = alice.http.get("/api/conversations", params={"after": last["updated_at"]})
    assert half.status_code == 400, half.text
