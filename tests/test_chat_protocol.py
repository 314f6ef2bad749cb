"""The chat protocol's shapes, in process: the WebSocket's frames decode to their structs (and a
frame it cannot serve is refused with the answer the socket has always given), and the OpenAPI
document describes what the page API and `/v1` answer with."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from app.domain.chat.frames import (
    BadFrameError,
    CancelFrame,
    RegenerateFrame,
    ResumeFrame,
    SendFrame,
    read_frame,
)
from app.domain.json_input import BadJsonError
from app.settings import EngineSettings, Settings
from app.web.app import create_app

# A fixed id: it appears in test ids, which pytest-xdist needs the same in every worker.
MESSAGE = str(uuid.UUID(int=0x5EED))


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ({"type": "send", "conversation_id": MESSAGE, "content": "hi", "top_k": 3}, SendFrame),
        ({"type": "regenerate", "message_id": MESSAGE, "temperature": 0}, RegenerateFrame),
        ({"type": "cancel", "message_id": MESSAGE}, CancelFrame),
        ({"client_ref": "r", "after": 4, "message_id": MESSAGE, "type": "resume"}, ResumeFrame),
    ],
)
def test_each_frame_decodes_to_its_struct(frame: dict[str, Any], kind: type) -> None:
    decoded = read_frame(json.dumps(frame))
    assert type(decoded) is kind
    assert str(getattr(decoded, "message_id", None) or decoded.conversation_id) == MESSAGE


DEEP = 100_000


@pytest.mark.parametrize(
    ("text", "error", "client_ref", "status"),
    [
        ("not json", "each frame must be a JSON object", None, 400),
        ("[1, 2]", "each frame must be a JSON object", None, 400),
        # nesting is found before the unknown field that msgspec stops at
        ('{"type": "send", "x": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply", None, 400),
        # msgspec refuses a lone surrogate outright; the answer still echoes the client_ref
        ('{"type": "send", "client_ref": "s", "content": "\\ud800"}', "surrogate", "s", 400),
        ('{"type": "send", "client_ref": "n", "content": "a\\u0000"}', "NUL", "n", 400),
        ('{"type": "send", "client_ref": "n\\u0000", "content": "a"}', "NUL", None, 400),
        (
            '{"type": "dance", "client_ref": "d"}',
            "unknown type 'dance': use send, cancel, resume, regenerate, edit or subscribe",
            "d",
            None,
        ),
        ('{"no_type": true}', "unknown type None", None, None),
        (
            '{"type": "resume", "message_id": "x", "client_ref": "u"}',
            "invalid resume request",
            "u",
            None,
        ),
        (
            '{"type": "cancel", "message_id": "' + MESSAGE + '", "extra": 1}',
            "invalid cancel request: Object contains unknown field `extra`",
            None,
            None,
        ),
    ],
)
def test_a_frame_it_cannot_serve_is_refused_as_always(
    text: str, error: str, client_ref: str | None, status: int | None
) -> None:
    with pytest.raises((BadJsonError, BadFrameError)) as refused:
        read_frame(text)
    assert error in str(refused.value)
    assert getattr(refused.value, "client_ref", None) == client_ref
    assert getattr(refused.value, "status", 400) == status


def test_the_openapi_document_describes_the_answers(tmp_path: Any) -> None:
    app = create_app(
        Settings(
            engine=EngineSettings(kind="synthetic"),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        )
    )
    document = app.openapi_schema.to_schema()
    components = document["components"]["schemas"]

    def answer(path: str, method: str, status: str) -> dict[str, Any]:
        content = document["paths"][path][method]["responses"][status]["content"]
        schema = content["application/json"]["schema"]
        if "$ref" in schema:
            return components[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    conversation = answer("/api/conversations", "post", "201")
    assert set(conversation["required"]) == {
        *("id", "title", "source", "created_at", "updated_at"),
        *("pinned_at", "archived_at"),  # null unless pinned, archived
    }
    listed = answer("/api/conversations", "get", "200")
    assert listed["type"] == "array" and listed["items"]["$ref"].endswith("ConversationResponse")
    read = answer("/api/conversations/{conversation_id}", "get", "200")
    assert read["properties"]["messages"]["items"]["$ref"].endswith("MessageResponse")
    message = components[read["properties"]["messages"]["items"]["$ref"].rsplit("/", 1)[1]]
    assert {"status", "finish_reason", "ttft_ms", "parent_id", "siblings"} <= set(
        message["properties"]
    )
    stopped = answer("/api/messages/{message_id}/cancel", "post", "200")
    assert set(stopped["properties"]) == {"message_id", "status"}
    models = answer("/v1/models", "get", "200")
    assert models["properties"]["data"]["items"]["$ref"].endswith("ModelCard")

    # A send names the message it follows (409: something follows it already).
    send = document["paths"]["/api/conversations/{conversation_id}/messages"]["post"]
    body = send["requestBody"]["content"]["application/json"]["schema"]
    body = components[body["$ref"].rsplit("/", 1)[1]] if "$ref" in body else body
    assert "parent_id" in body["properties"] and "parent_id" not in body.get("required", [])
    assert {"404", "409"} <= set(send["responses"])
    # /v1: messages over the context are OpenAI's `context_length_exceeded`.
    completions = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "context_length_exceeded" in completions["400"]["description"]
