"""A conversation longer than the model's context, through a live server with SmolLM2, on SQLite
and PostgreSQL (issue 22, items 1, 2 and 4; app/domain/chat/prompts/window.py).

With ENGINE_CONTEXT 512 and replies of 64 tokens, a dozen turns overflow the context several
times, and every turn still answers: the prompt is the newest whole turns that fit. Each reply
stores where its window began; the window keeps its start while it fits and then moves in a step
(so the next turns share a prefix), its prompt within the context less the reply's reserve. The
final frame says the context used and its size; regenerate keeps the reply's window, an edit of
an old question answers on its shorter branch; a message too long to fit alone is refused naming
the limit, which the conversation's GET gave beforehand; export and import keep the windows.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.live_server import PageClient, PageStream, read_stream

CONTEXT = 512
REPLY = 64
PARAMS: dict[str, Any] = {"temperature": 0, "seed": 3, "max_tokens": REPLY}
TURNS = 12
TOPICS = ["dragons", "the sea", "mountains", "bread", "trains", "owls", "rain", "castles"]


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"ENGINE_CONTEXT": CONTEXT, "DEFAULT_MAX_TOKENS": 32}


def stream(client: PageClient, path: str, body: dict[str, Any]) -> PageStream:
    with client.http.stream("POST", path, json=body, headers=client.csrf_headers()) as response:
        assert response.status_code == 200, response.read()
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final", record.events[-1:]
    return record


def ask(client: PageClient, conversation: str, content: str) -> PageStream:
    path = f"/api/conversations/{conversation}/messages"
    return stream(client, path, {"content": content, **PARAMS})


def question(n: int) -> str:
    return f"Question {n}: tell me a long story about {TOPICS[n % len(TOPICS)]}."


def check_windows(messages: list[dict[str, Any]]) -> list[str | None]:
    """Each reply's window starts at a question before it (or none), fits the context with the
    reply's reserve, and never moves back; returns the starts, oldest reply first."""
    index = {m["id"]: i for i, m in enumerate(messages)}
    starts: list[str | None] = []
    last = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = m["window_start_id"]
        at = 0 if start is None else index[start]
        assert at <= i - 1 and messages[at]["role"] == "user", (i, start)
        assert at >= last, "the window moved back"
        assert m["prompt_tokens"] + REPLY <= CONTEXT
        last = at
        starts.append(start)
    return starts


def test_a_conversation_past_the_context_keeps_answering_in_steps(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    shown = alice.conversation(conversation)
    limits = shown["context"]
    assert limits["context_size"] == CONTEXT and limits["reply_tokens"] == 32  # the default
    assert 0 < limits["max_message_tokens"] < CONTEXT - 32

    for n in range(TURNS):
        record = ask(alice, conversation, question(n))
        final = record.end.json() if record.end else {}
        assert final["status"] in ("completed", "length") and record.text.strip(), final
        usage = final["usage"]
        assert final["context_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert final["context_size"] == CONTEXT
        assert final["context_tokens"] <= CONTEXT

    messages = alice.conversation(conversation)["messages"]
    assert len(messages) == 2 * TURNS
    starts = check_windows(messages)
    moves = sum(1 for a, b in itertools.pairwise(starts) if a != b)
    assert starts[-1] is not None and moves >= 2, starts  # it overflowed, more than once
    assert moves <= TURNS // 2, starts  # in steps: most turns keep the previous one's start
    # counted once: every question when written, every reply by the next send
    assert all(m["token_count"] for m in messages[:-1]), [m["token_count"] for m in messages]

    # Regenerate the latest reply: the same window, the same prompt.
    last = messages[-1]
    again = stream(alice, f"/api/messages/{last['id']}/regenerate", PARAMS)
    regenerated = alice.wait_final(conversation, again.message_id)
    assert regenerated["window_start_id"] == last["window_start_id"]
    assert regenerated["prompt_tokens"] == last["prompt_tokens"]

    # Edit an old question: its branch is short, so all of it fits.
    old_question = messages[4]
    edited = stream(alice, f"/api/messages/{old_question['id']}/edit", {"content": "Tell me about owls.", **PARAMS})  # fmt: skip
    branch = alice.conversation(conversation)["messages"]
    assert len(branch) == 6 and branch[-1]["id"] == edited.message_id
    assert alice.wait_final(conversation, edited.message_id)["window_start_id"] is None
    # ... and regenerating that reply works too; then a turn after it
    stream(alice, f"/api/messages/{edited.message_id}/regenerate", PARAMS)
    ask(alice, conversation, question(99))
    check_windows(alice.conversation(conversation)["messages"])


def test_a_message_too_long_for_the_context_is_refused_naming_the_limit(
    alice: PageClient,
) -> None:
    conversation = alice.new_conversation()
    limit = alice.conversation(conversation)["context"]["max_message_tokens"]
    with alice.send(conversation, "word " * (2 * limit)) as response:  # the default reply length
        assert response.status_code == 400
        body = json.loads(response.read())
    assert f"the longest that fits is {limit} tokens" in body["detail"], body
    assert alice.conversation(conversation)["messages"] == []  # nothing written
    # long ones that fit alone are answered, the history making way for each
    for _ in range(3):
        ask(alice, conversation, "word " * (limit // 2))


def test_export_and_import_keep_the_windows(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    for n in range(8):
        ask(alice, conversation, question(n))
    exported = alice.http.get(f"/api/conversations/{conversation}/export?format=json")
    document = exported.json()
    by_id = {m["id"]: m for m in document["messages"]}
    windows = [m["window_start_id"] for m in document["messages"] if m["role"] == "assistant"]
    assert windows[-1] is not None and windows[-1] in by_id

    imported = alice.post(
        "/api/conversations/import",
        content=exported.content,
        json_body=None,
        headers={"content-type": "application/json"},
    )
    assert imported.status_code == 201, imported.text
    copy = alice.conversation(imported.json()["id"])["messages"]
    copied = {m["id"]: m for m in copy}
    for original, new in zip(
        [m for m in document["messages"] if m["role"] == "assistant"],
        [m for m in copy if m["role"] == "assistant"],
        strict=True,
    ):
        start = original["window_start_id"]
        if start is None:
            assert new["window_start_id"] is None
        else:  # the same message, under its new id
            assert copied[new["window_start_id"]]["content"] == by_id[start]["content"]
    # and the copy goes on from its windows
    ask(alice, imported.json()["id"], question(8))
    check_windows(alice.conversation(imported.json()["id"])["messages"])
