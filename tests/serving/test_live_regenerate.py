"""Regenerate (`POST /api/messages/{id}/regenerate`) against a real server and the real SmolLM2
model, on SQLite and PostgreSQL.

Regenerate answers the latest reply's question again: the new reply streams like any other and
is shown, and carried in later prompts, from then on; the old one stays as another version of the
reply (the page's switcher; tests/serving/test_live_branches.py switches between them), and the
admin sees both. "The same prompt" shows as the same prompt token count.
(Not the same text, even greedy: the regenerate reuses the cached prompt, and a last token decoded
alone instead of inside a prefill chunk may round differently.)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import httpx

from tests.live_server import (
    PageClient,
    PageStream,
    SseReader,
    query,
    read_stream,
    row_counts,
)

GREEDY: dict[str, Any] = {"temperature": 0, "seed": 7, "max_tokens": 12}
STORY = "Write a long story about a dragon."


@contextmanager
def regenerate(client: PageClient, message_id: str, **params: Any):  # type: ignore[no-untyped-def]
    with client.http.stream(
        "POST",
        f"/api/messages/{message_id}/regenerate",
        json=params,
        headers=client.csrf_headers(),
    ) as response:
        yield response


def ask(client: PageClient, conversation: str, content: str, **params: Any) -> PageStream:
    with client.send(conversation, content, **{**GREEDY, **params}) as response:
        assert response.status_code == 200, response.read()
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final"
    return record


def versions(client: PageClient, conversation: str) -> list[str]:
    """The ids of the versions of the conversation's last message shown."""
    return client.conversation(conversation)["messages"][-1]["siblings"]


def test_regenerate_adds_a_version_of_the_latest_reply(
    alice: PageClient, live_database_url: str
) -> None:
    """The new reply streams (start, deltas, final), answers the same question (same user
    message id, same prompt tokens), and is shown in the old reply's place; the old row is kept,
    as the other version. The next turn's prompt leaves the version not shown out: a long old
    reply (60 tokens) followed by a short one (3) would add 60 tokens to it if it were there."""
    conversation = alice.new_conversation()
    first = ask(alice, conversation, STORY, max_tokens=60)  # greedy SmolLM2 runs to the limit
    old_id = first.message_id
    assert first.end is not None and first.end.json()["usage"]["completion_tokens"] == 60

    with regenerate(alice, old_id, **{**GREEDY, "max_tokens": 3}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        again = read_stream(response)
    assert again.end is not None and again.end.event == "final", again.events[-1:]
    assert again.message_id != old_id
    assert again.start["user_message_id"] == first.start["user_message_id"]
    assert len(again.deltas) >= 1
    new = alice.wait_final(conversation, again.message_id)
    old_final = first.end.json() if first.end else {}
    assert new["status"] in ("completed", "length")
    assert new["prompt_tokens"] == old_final["usage"]["prompt_tokens"]
    assert new["content"] == again.text

    messages = alice.conversation(conversation)["messages"]
    assert [(m["role"], m["id"]) for m in messages] == [
        ("user", first.start["user_message_id"]),
        ("assistant", again.message_id),
    ]
    assert versions(alice, conversation) == [old_id, again.message_id]
    old_row = query(
        live_database_url, "SELECT content, status FROM messages WHERE content = :c", c=first.text
    )
    assert old_row, "the old version's row (and text) is gone"
    # The admin sees both versions, the one the user sees marked.
    page = alice.http.get(f"/admin/conversations/{conversation}").text
    assert f'data-message-id="{old_id}" data-shown="false"' in page
    assert f'data-message-id="{again.message_id}" data-shown="true"' in page

    # The next turn is built on the new (3-token) reply only: its prompt grows by that reply,
    # the question and the template's markers, far less than the 60 tokens of the replaced one.
    second = ask(alice, conversation, "Now say goodbye.")
    assert second.end is not None
    growth = second.end.json()["usage"]["prompt_tokens"] - old_final["usage"]["prompt_tokens"]
    assert 0 < growth < 40, growth
    with regenerate(alice, second.message_id, **GREEDY) as response:
        assert response.status_code == 200
        second_again = read_stream(response)
    assert second_again.end is not None
    assert (
        second_again.end.json()["usage"]["prompt_tokens"]
        == second.end.json()["usage"]["prompt_tokens"]  # type: ignore[union-attr]
    )
    assert versions(alice, conversation) == [second.message_id, second_again.message_id]


def test_regenerate_refusals_write_nothing(
    alice: PageClient, bob: PageClient, live_database_url: str
) -> None:
    """Every reply that cannot be regenerated gets a clear 4xx and changes nothing: an earlier
    reply (409), one still streaming (409), another user's (404), a user message (404), an
    unknown id (404), out-of-range sampling params (400). (An old version of the latest reply
    has nothing after it either: regenerating it adds a third version.)"""
    conversation = alice.new_conversation()
    first = ask(alice, conversation, "Say hello.")
    second = ask(alice, conversation, "Say goodbye.")

    def shown() -> list[tuple[str, list[str]]]:
        """The branch shown: its messages and their versions (a streaming reply's text grows)."""
        return [(m["id"], m["siblings"]) for m in alice.conversation(conversation)["messages"]]

    def refused(client: PageClient, message_id: str, status: int, **params: Any) -> str:
        before = row_counts(live_database_url)
        shown_before = shown()
        with regenerate(client, message_id, **params) as response:
            body = response.read()
        assert response.status_code == status, (response.status_code, body)
        assert row_counts(live_database_url) == before
        assert shown() == shown_before
        return response.json()["detail"]

    assert "latest" in refused(alice, first.message_id, 409)
    assert refused(bob, second.message_id, 404) == "no such message"
    assert refused(alice, first.start["user_message_id"], 404) == "no such message"
    assert refused(alice, "00000000-0000-4000-8000-000000000000", 404) == "no such message"
    assert "max_tokens" in refused(alice, second.message_id, 400, max_tokens=0)

    with regenerate(alice, second.message_id, **GREEDY) as response:
        assert response.status_code == 200
        third = read_stream(response)
    with regenerate(alice, second.message_id, **GREEDY) as response:  # the old version, again
        assert response.status_code == 200
        fourth = read_stream(response)
    assert versions(alice, conversation) == [
        second.message_id,
        third.message_id,
        fourth.message_id,
    ]

    # While a reply streams it cannot be regenerated (stop it first).
    with alice.send(conversation, STORY, temperature=0, max_tokens=400) as response:
        record = PageStream()
        for item in SseReader(response):
            event = record.add(item)
            if event is not None and event.event == "delta":
                break
        streaming_id = record.message_id
        assert "streaming" in refused(alice, streaming_id, 409)
        assert alice.cancel(streaming_id).json()["status"] == "cancelled"
    assert third.message_id != second.message_id
    assert alice.wait_engine_idle(timeout_s=10)["running"] == 0


def test_regenerate_needs_the_csrf_token_and_nothing_else(alice: PageClient) -> None:
    """A cookie-authenticated write: without the CSRF header it is refused before anything.
    With it, no body at all is fine (the server's sampling defaults)."""
    conversation = alice.new_conversation()
    first = ask(alice, conversation, "Say hello.")
    response = alice.http.post(f"/api/messages/{first.message_id}/regenerate", json={})
    assert response.status_code == 403
    anonymous = httpx.post(f"{alice.base_url}/api/messages/{first.message_id}/regenerate")
    assert anonymous.status_code in (401, 403)
    messages = alice.conversation(conversation)["messages"]
    assert [m["id"] for m in messages][-1] == first.message_id

    with alice.http.stream(
        "POST",
        f"/api/messages/{first.message_id}/regenerate",
        headers=alice.csrf_headers(),
    ) as response:
        again = read_stream(response)
    assert again.end is not None and again.end.event == "final"
    messages = alice.conversation(conversation)["messages"]
    assert [m["id"] for m in messages][-1] == again.message_id != first.message_id
