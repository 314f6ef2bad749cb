"""Search, export/import and ratings through the page API of a live server with the real model,
on SQLite and PostgreSQL (issue 11, items 4 and 6)."""

from __future__ import annotations

import json
import secrets
from typing import Any

from tests.live_server import PageClient, read_stream

QUICK: dict[str, Any] = {"temperature": 0, "seed": 3, "max_tokens": 4}


def chat(client: PageClient, content: str) -> tuple[str, str]:
    """A conversation with one finished turn: (conversation id, reply id)."""
    conversation = client.new_conversation()
    with client.send(conversation, content, **QUICK) as response:
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final"
    client.wait_final(conversation, record.message_id)
    return conversation, record.message_id


def test_search_finds_the_users_own_text_only(alice: PageClient, bob: PageClient) -> None:
    word = f"Quokka{secrets.token_hex(3)}"
    mine, _ = chat(alice, f"Tell me about the {word} please")

    found = alice.http.get("/api/conversations/search", params={"q": word.upper()})
    assert found.status_code == 200, found.text
    [hit] = found.json()
    assert hit["conversation_id"] == mine and hit["message_id"]
    assert hit["snippet"] == {"before": "Tell me about the ", "match": word, "after": " please"}

    assert bob.http.get("/api/conversations/search", params={"q": word}).json() == []
    refused = alice.http.get("/api/conversations/search", params={"q": "x" * 201})
    assert refused.status_code == 400


def regenerate(client: PageClient, conversation: str, reply_id: str) -> str:
    """Answer `reply_id`'s question again (a second version of the reply); the new reply's id."""
    path = f"/api/messages/{reply_id}/regenerate"
    with client.http.stream("POST", path, json=QUICK, headers=client.csrf_headers()) as response:
        assert response.status_code == 200, response.read()
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final"
    client.wait_final(conversation, record.message_id)
    return record.message_id


def without_ids(document: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int | None], int]:
    """An export's messages without their ids, the index of each one's parent, the leaf's index:
    equal for two exports of the same tree under different ids."""
    at = {m["id"]: i for i, m in enumerate(document["messages"])}
    rows = [{k: v for k, v in m.items() if k not in ("id", "parent_id")} for m in document["messages"]]  # fmt: skip
    parents = [at.get(m["parent_id"]) for m in document["messages"]]
    return rows, parents, at[document["conversation"]["current_leaf_id"]]


def test_export_as_markdown_and_json_and_import_the_json_back(alice: PageClient) -> None:
    conversation, first_id = chat(alice, "Say hi")
    reply_id = regenerate(alice, conversation, first_id)  # two versions of the reply
    reply = alice.message(conversation, reply_id)

    md = alice.http.get(f"/api/conversations/{conversation}/export", params={"format": "md"})
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert md.headers["content-disposition"].startswith("attachment; filename=")
    assert "## You\n\nSay hi" in md.text and reply["content"] in md.text
    assert md.text.count("## Assistant") == 1  # the branch shown, not every version

    exported = alice.http.get(f"/api/conversations/{conversation}/export?format=json")
    assert exported.status_code == 200 and "attachment" in exported.headers["content-disposition"]
    document = exported.json()
    assert document["format"] == "streamchat.conversation" and document["version"] == 2
    question, first, second = document["messages"]
    assert [m["role"] for m in (question, first, second)] == ["user", "assistant", "assistant"]
    assert [first["id"], second["id"]] == [first_id, reply_id]
    assert question["parent_id"] is None and first["parent_id"] == second["parent_id"] == question["id"]  # fmt: skip
    assert document["conversation"]["current_leaf_id"] == reply_id
    assert second["status"] == reply["status"] and second["ttft_ms"] == reply["ttft_ms"]

    imported = alice.post(
        "/api/conversations/import",
        content=exported.content,
        json_body=None,
        headers={"content-type": "application/json"},
    )
    assert imported.status_code == 201, imported.text
    copy = imported.json()["id"]
    assert copy != conversation
    again = alice.http.get(f"/api/conversations/{copy}/export?format=json").json()
    assert without_ids(again) == without_ids(document)  # the tree, texts, statuses, timings kept
    assert not {m["id"] for m in again["messages"]} & {m["id"] for m in document["messages"]}
    shown = alice.http.get(f"/api/conversations/{copy}").json()["messages"]
    assert [m["id"] for m in shown] == [again["messages"][0]["id"], again["messages"][2]["id"]]
    assert shown[1]["siblings"] == [again["messages"][1]["id"], again["messages"][2]["id"]]
    listed = [c["id"] for c in alice.http.get("/api/conversations").json()]
    assert listed[0] == copy  # on top of the importer's list


def test_import_refuses_malformed_files_clearly(alice: PageClient) -> None:
    def send(body: bytes, **headers: str):  # type: ignore[no-untyped-def]
        return alice.post(
            "/api/conversations/import",
            content=body,
            headers={"content-type": "application/json", **headers},
        )

    not_json = send(b"{oops")
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["detail"]
    wrong = send(json.dumps({"format": "streamchat.conversation", "version": 9}).encode())
    assert wrong.status_code == 400 and "version" in wrong.json()["detail"]
    too_big = send(b" " * 5_000_001)
    assert too_big.status_code == 413
    no_csrf = alice.http.post("/api/conversations/import", content=b"{}")
    assert no_csrf.status_code == 403


def test_the_admin_exports_anyones_conversation_and_nobody_else_can(
    alice: PageClient, bob: PageClient
) -> None:
    theirs, _ = chat(bob, "Bob's question")
    admin = alice.http.get(f"/admin/api/conversations/{theirs}/export?format=json")
    assert admin.status_code == 200, admin.text
    assert admin.json()["messages"][0]["content"] == "Bob's question"
    md = alice.http.get(f"/admin/api/conversations/{theirs}/export?format=md")
    assert md.status_code == 200 and "Bob's question" in md.text

    mine, _ = chat(alice, "Alice's question")
    assert bob.http.get(f"/admin/api/conversations/{mine}/export").status_code == 403
    assert bob.http.get(f"/api/conversations/{mine}/export").status_code == 404
    missing = alice.http.get(f"/admin/api/conversations/{'0' * 32}/export")
    assert missing.status_code == 404


def test_rate_a_reply_change_it_and_take_it_back(alice: PageClient, bob: PageClient) -> None:
    conversation, reply_id = chat(alice, "Rate me")
    path = f"/api/messages/{reply_id}/rating"

    def put(client: PageClient, body: dict[str, Any]):  # type: ignore[no-untyped-def]
        return client.http.put(path, json=body, headers=client.csrf_headers())

    first = put(alice, {"rating": "up", "comment": "clear and short"})
    assert first.status_code == 200, first.text
    assert first.json()["rating"] == "up" and first.json()["comment"] == "clear and short"
    assert put(alice, {"rating": "down"}).json()["rating"] == "down"
    stored = alice.http.get(f"/api/conversations/{conversation}/ratings").json()
    assert [(r["message_id"], r["rating"], r["comment"]) for r in stored] == [
        (reply_id, "down", None)
    ]

    assert put(alice, {"rating": "meh"}).status_code == 400
    assert put(bob, {"rating": "up"}).status_code == 404  # not bob's reply
    assert bob.http.get(f"/api/conversations/{conversation}/ratings").status_code == 404

    gone = alice.http.delete(path, headers=alice.csrf_headers())
    assert gone.status_code == 204
    assert alice.http.delete(path, headers=alice.csrf_headers()).status_code == 404
    assert alice.http.get(f"/api/conversations/{conversation}/ratings").json() == []
