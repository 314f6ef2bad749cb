"""The OpenAI chat-completions wire format, both ways: the request body, and the streamed chunks.

The stream is `text/event-stream`: `data: {chunk}` lines, then `data: [DONE]`. A chunk carries
`choices[0].delta.content` (new text), `choices[0].finish_reason` once, and, with
`stream_options.include_usage`, a last chunk with empty `choices` and the `usage` counts
(llama.cpp: tools/server/server-task.cpp, `to_json_oaicompat_chat_stream`). An error after the
headers comes as a chunk with an `error` object.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from app.engine.base import ChatMessages, FinishReason, SamplingParams

# What the upstreams' finish reasons mean here; anything else ends the reply `error`.
FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class UpstreamProtocolError(Exception):
    """The upstream sent something that is not an OpenAI chat-completions stream, or an error."""


def chat_body(model: str, messages: ChatMessages, params: SamplingParams) -> dict[str, Any]:
    """The request, less its sampling fields (each upstream's own: app/engine/openai/sampling.py)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [dict(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens,
    }
    if params.stop:  # applied again by the engine, for servers that ignore it
        body["stop"] = list(params.stop)
    return body


@dataclass(slots=True)
class Chunk:
    """What one chunk adds: text, the finish reason (once), the usage counts (once)."""

    text: str
    finish_reason: str | None
    usage: dict[str, int] | None


def parse_chunk(data: str) -> Chunk:
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise UpstreamProtocolError(f"a chunk that is not JSON: {data[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise UpstreamProtocolError(f"a chunk that is not an object: {data[:200]!r}")
    if "error" in chunk:
        raise UpstreamProtocolError(f"the upstream failed: {error_message(chunk)}")
    text, finish = [], None
    for choice in chunk.get("choices") or ():
        text.append((choice.get("delta") or {}).get("content") or "")
        finish = choice.get("finish_reason") or finish
    usage = chunk.get("usage")
    return Chunk("".join(text), finish, usage if isinstance(usage, dict) else None)


async def chunks(response: httpx.Response) -> AsyncIterator[Chunk]:
    """The response's chunks as they arrive (httpx hands each line over as soon as it is whole);
    ends at `data: [DONE]` or when the upstream closes the stream."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, `: comments`, `event:` names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield parse_chunk(data)


def error_message(payload: Any) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`), or the body."""
    if isinstance(payload, bytes | str):
        try:
            payload = json.loads(payload)
        except ValueError:
            return str(payload[:300] if isinstance(payload, str) else payload[:300].decode())
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return json.dumps(payload)[:300]
