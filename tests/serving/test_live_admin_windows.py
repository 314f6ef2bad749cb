"""The admin's conversation view shows each reply's context window (issue 22, item 3), through a
live server with SmolLM2 whose context (512 tokens) a few turns overflow: every message is
numbered on its branch, and every reply says what its model saw, in those numbers, matching the
`window_start_id` the page's API gives (app/domain/admin/tree_view.py)."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from tests.live_server import PageClient, read_stream

CONTEXT = 512
PARAMS: dict[str, Any] = {"temperature": 0, "seed": 3, "max_tokens": 64}


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    """test_live_context_window.py's configuration: the two modules share a server."""
    return {"ENGINE_CONTEXT": CONTEXT, "DEFAULT_MAX_TOKENS": 32}


def ask(client: PageClient, conversation: str, content: str) -> None:
    path = f"/api/conversations/{conversation}/messages"
    body = {"content": content, **PARAMS}
    with client.http.stream("POST", path, json=body, headers=client.csrf_headers()) as response:
        assert response.status_code == 200, response.read()
        record = read_stream(response)
    assert record.end is not None and record.end.event == "final", record.events[-1:]


def admin_windows(page: str) -> dict[str, tuple[str, str, str]]:
    """message id -> (its position, its window's start id, the window in words), per reply."""
    found = {}
    for item in re.findall(r'<li class="admin-message.*?</li>', page, re.S):
        message_id = re.search(r'data-message-id="([^"]+)"', item)
        window = re.search(
            r'data-testid="admin-window" data-window-start="([^"]*)">(.*?)</p>', item, re.S
        )
        position = re.search(r'data-testid="admin-position">#(\d+)<', item)
        assert message_id and position, item
        if window:
            words = html.unescape(re.sub(r"\s+", " ", window.group(2)))
            found[message_id.group(1)] = (position.group(1), window.group(1), words)
    return found


def test_the_admin_sees_what_each_reply_saw(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    for n in range(10):
        ask(alice, conversation, f"Question {n}: tell me a long story about the sea and ships.")
        messages = alice.conversation(conversation)["messages"]
        if messages[-1]["window_start_id"] is not None and n >= 3:
            break
    assert messages[-1]["window_start_id"] is not None, "the context never overflowed"

    page = alice.http.get(f"/admin/conversations/{conversation}")
    assert page.status_code == 200
    windows = admin_windows(page.text)
    positions = {m["id"]: i for i, m in enumerate(messages, start=1)}
    replies = [m for m in messages if m["role"] == "assistant"]
    assert set(windows) == {m["id"] for m in replies}
    first = replies[0]
    first_used = first["prompt_tokens"] + first["completion_tokens"]
    assert windows[first["id"]][1:] == (
        "",
        f"Context: saw the whole conversation · {first_used} tokens used "
        f"({first['prompt_tokens']} prompt)",
    )
    for reply in replies:
        position, start, words = windows[reply["id"]]
        assert int(position) == positions[reply["id"]]
        assert start == (reply["window_start_id"] or "")
        if reply["window_start_id"] is None:
            assert "saw the whole conversation" in words
        else:
            at = positions[reply["window_start_id"]]
            assert f"(message {at})" in words or f"saw from message {at}:" in words, words
            assert f"1–{at - 1} were outside its window" in words or at == 2, words
        used = reply["prompt_tokens"] + reply["completion_tokens"]
        assert f"· {used} tokens used ({reply['prompt_tokens']} prompt)" in words, words
        assert used <= CONTEXT
