"""Per-conversation settings and users' defaults (`/api/conversations/{id}/settings`,
`/api/account/chat-defaults`) against a real server with the synthetic engine, on SQLite and
PostgreSQL: stored, checked like a request's fields, and used for every turn.

The synthetic engine's reply is a function of the rendered prompt (and the seed), so running it
here, in this process, on the messages the server should have built tells whether the server's
prompt had the system prompt first: the texts are equal only if the prompts are.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.engine import create_engine
from app.engine.base import SamplingParams
from app.settings import EngineSettings
from tests.engine.streams import collect
from tests.live_server import LiveServer, PageClient, read_stream
from tests.serving.test_live_regenerate import regenerate
from tests.serving.test_live_websocket import WsReply, open_socket, send_json

QUESTION = "[[synthetic:tokens=500]] What is a good name for a cat?"
SYSTEM = "You answer in rhyme."
CHOSEN = {
    "system_prompt": SYSTEM,
    "temperature": 0.9,
    "top_p": 0.8,
    "max_tokens": 20,
    "stop": ["zzz"],
    "min_p": 0.1,
    "frequency_penalty": 0.4,
    "presence_penalty": 0.3,
    "repeat_penalty": 1.2,
}


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


def settings_path(conversation: str) -> str:
    return f"/api/conversations/{conversation}/settings"


def put(client: PageClient, path: str, body: Any) -> Any:
    return client.http.put(path, json=body, headers=client.csrf_headers())


def synthetic_reply(messages: list[dict[str, str]], max_tokens: int) -> str:
    """What the synthetic engine answers to exactly these messages (no seed, as the page sends)."""

    async def run() -> str:
        engine = create_engine(EngineSettings(kind="synthetic", synthetic_step_ms=0.0))
        await engine.start()
        try:
            params = SamplingParams(max_tokens=max_tokens)
            text, _, _ = await collect(engine.generate("expected", messages, params))
            return text
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def test_settings_are_stored_and_shown_with_the_defaults(alice: PageClient) -> None:
    conversation = alice.new_conversation()
    fresh = alice.http.get(settings_path(conversation))
    assert fresh.status_code == 200, fresh.text
    view = fresh.json()
    assert view["settings"]["system_prompt"] == "" and view["settings"]["temperature"] is None
    assert (
        view["model_defaults"]["temperature"] == 0.2
    )  # MODEL_DEFAULTS, app/domain/chat/replies/limits.py
    assert view["model_defaults"]["max_tokens"] > 0

    saved = put(alice, settings_path(conversation), CHOSEN)
    assert saved.status_code == 200, saved.text
    again = alice.http.get(settings_path(conversation)).json()["settings"]
    assert {k: again[k] for k in CHOSEN} == CHOSEN


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 3},
        {"top_p": 0},
        {"max_tokens": 0},
        {"min_p": 2},
        {"frequency_penalty": 5},
        {"repeat_penalty": 0},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"system_prompt": "x" * 20000},
        {"temperature": "hot"},
        {"wizardry": 1},
    ],
)
def test_bad_settings_are_400_and_change_nothing(alice: PageClient, bad: dict[str, Any]) -> None:
    conversation = alice.new_conversation()
    for path in (settings_path(conversation), "/api/account/chat-defaults"):
        before = alice.http.get(path).json()
        response = put(alice, path, bad)
        assert response.status_code == 400, (path, response.text)
        assert alice.http.get(path).json() == before


def test_another_users_conversation_settings_are_not_found(
    alice: PageClient, bob: PageClient
) -> None:
    conversation = alice.new_conversation()
    assert bob.http.get(settings_path(conversation)).status_code == 404
    assert put(bob, settings_path(conversation), CHOSEN).status_code == 404
    assert alice.http.get(settings_path(conversation)).json()["settings"]["system_prompt"] == ""


def test_every_turn_uses_the_conversations_settings(server: LiveServer, bob: PageClient) -> None:
    """Send (SSE and WebSocket) and regenerate: the system prompt goes first in the prompt and
    the settings' max_tokens cuts the reply, with nothing in the request itself."""
    conversation = bob.new_conversation()
    assert put(bob, settings_path(conversation), CHOSEN).status_code == 200

    with bob.send(conversation, QUESTION) as response:
        assert response.status_code == 200, response.read()
        first = read_stream(response)
    assert first.end is not None and first.end.event == "final"
    final = first.end.json()
    assert final["usage"]["completion_tokens"] == CHOSEN["max_tokens"]
    system_first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    assert first.text == synthetic_reply(system_first, CHOSEN["max_tokens"])
    assert first.text != synthetic_reply(system_first[1:], CHOSEN["max_tokens"])

    with regenerate(bob, first.message_id) as response:
        assert response.status_code == 200, response.read()
        again = read_stream(response)
    assert again.end is not None and again.end.event == "final"
    assert again.text == first.text  # the same prompt, system prompt included
    assert again.end.json()["usage"]["prompt_tokens"] == final["usage"]["prompt_tokens"]

    second = "And a name for a dog?"
    with open_socket(server, bob) as ws:
        send_json(ws, {"type": "send", "conversation_id": conversation, "content": second})
        reply = WsReply().read(ws)
    assert reply.end is not None and reply.end["type"] == "final"
    history = [
        *system_first,
        {"role": "assistant", "content": again.text},
        {"role": "user", "content": second},
    ]
    assert reply.text == synthetic_reply(history, CHOSEN["max_tokens"])


def test_new_conversations_start_from_the_users_defaults(alice: PageClient) -> None:
    defaults = {"system_prompt": "Be brief.", "temperature": 0.5, "max_tokens": 64}
    saved = put(alice, "/api/account/chat-defaults", defaults)
    assert saved.status_code == 200, saved.text
    shown = alice.http.get("/api/account/chat-defaults").json()["settings"]
    assert {k: shown[k] for k in defaults} == defaults

    conversation = alice.new_conversation()
    settings = alice.http.get(settings_path(conversation)).json()["settings"]
    assert {k: settings[k] for k in defaults} == defaults
    assert settings["top_p"] is None  # not in the defaults: the model's default applies

    put(alice, "/api/account/chat-defaults", {})  # back to none, for the other tests
    later = alice.http.get(settings_path(alice.new_conversation())).json()["settings"]
    assert later["system_prompt"] == "" and later["temperature"] is None
    kept = alice.http.get(settings_path(conversation)).json()["settings"]
    assert {k: kept[k] for k in defaults} == defaults  # a copy: earlier conversations keep theirs
