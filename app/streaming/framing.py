"""One streaming core, three framings: the page's SSE, the page's WebSocket, OpenAI's SSE chunks.

Each framing is a pure function of a stream event; the transports only write what these return.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from app.streaming.events import Delta, Final, Start, Status, StreamEvent

SSE_KEEPALIVE = b": keepalive\n\n"


_encode = msgspec.json.Encoder().encode  # compact UTF-8 JSON, several times faster than json.dumps


def _json(data: Any) -> str:
    return _encode(data).decode()


# -- the page: named events with character-offset ids -------------------------------------------


def page_event(event: StreamEvent, message_id: str) -> tuple[str, int, dict[str, Any]]:
    """(event name, id, payload) shared by the page's SSE and WebSocket framings."""
    if isinstance(event, Start):
        return "start", event.id, event.as_dict()
    if isinstance(event, Delta):
        return "delta", event.id, {"message_id": message_id, "text": event.text}
    payload = {"message_id": message_id, **event.as_dict()}
    # A failure after the 200 can only be reported in-band: it is the stream's last event.
    return ("error" if event.status is Status.FAILED else "final"), event.id, payload


def page_sse(event: StreamEvent, message_id: str) -> bytes:
    if type(event) is Delta:  # the per-token case: the same bytes as below, without the dict
        return b'event: delta\nid: %d\ndata: {"message_id":%s,"text":%s}\n\n' % (
            event.id,
            _encode(message_id),
            _encode(event.text),
        )
    name, event_id, payload = page_event(event, message_id)
    return b"event: %s\nid: %d\ndata: %s\n\n" % (name.encode(), event_id, _encode(payload))


def page_ws(event: StreamEvent, message_id: str) -> dict[str, Any]:
    name, event_id, payload = page_event(event, message_id)
    return {"type": name, "id": event_id, **payload}


# -- OpenAI's chat.completion.chunk -------------------------------------------------------------

OPENAI_DONE = b"data: [DONE]\n\n"

_OPENAI_FINISH = {Status.COMPLETED: "stop", Status.LENGTH: "length"}


def openai_finish_reason(status: Status) -> str:
    """OpenAI clients know `stop` and `length`; any other ending is reported as `stop`."""
    return _OPENAI_FINISH.get(status, "stop")


class OpenAIChunks:
    """Frames one reply as OpenAI `chat.completion.chunk` events."""

    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        # A delta chunk is these bytes around its JSON-encoded text: what `_chunk` would build.
        head, tail = self._chunk(
            [{"index": 0, "delta": {"content": "\0"}, "finish_reason": None}]
        ).rsplit(b'"\\u0000"', 1)
        self._delta_head, self._delta_tail = head, tail

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        if self.include_usage and "usage" not in extra:
            body["usage"] = None
        return f"data: {_json(body)}\n\n".encode()

    def frame(self, event: StreamEvent) -> bytes:
        if isinstance(event, Start):
            return self._chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
        if type(event) is Delta:  # per token: no dict to build, one string to encode
            return self._delta_head + _encode(event.text) + self._delta_tail
        return self._final(event)

    def _final(self, final: Final) -> bytes:
        if final.status is Status.FAILED:
            error = {"message": final.error or "generation failed", "type": "server_error"}
            return f"data: {_json({'error': error})}\n\n".encode() + OPENAI_DONE
        out = self._chunk(
            [{"index": 0, "delta": {}, "finish_reason": openai_finish_reason(final.status)}]
        )
        if self.include_usage:
            out += self._chunk([], usage=final.usage)
        return out + OPENAI_DONE


def openai_completion(
    completion_id: str, model: str, text: str, final: Final, created: int | None = None
) -> dict[str, Any]:
    """The non-streaming `chat.completion` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": openai_finish_reason(final.status),
            }
        ],
        "usage": final.usage,
    }
