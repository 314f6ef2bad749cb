"""A reply's events as OpenAI's answer: `chat.completion.chunk` server-sent events, or, collected,
one `chat.completion` (the structs: app/domain/openai/schemas.py).

A delta chunk is per token: `OpenAIChunks.frame` writes its bytes around the JSON-encoded text,
cut once per reply from the encoded struct; tests/test_reply_frames.py checks them against the
struct's encoding.
"""

from __future__ import annotations

import time

import msgspec
from msgspec import UNSET

from app.domain.openai.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    CompletionChoice,
    StreamError,
    StreamErrorDetail,
)
from app.streaming.events import Delta, Final, Start, Status, StreamEvent

_encode = msgspec.json.Encoder().encode

OPENAI_DONE = b"data: [DONE]\n\n"

_OPENAI_FINISH = {Status.COMPLETED: "stop", Status.LENGTH: "length"}


def openai_finish_reason(status: Status) -> str:
    """OpenAI clients know `stop` and `length`; any other ending is reported as `stop`."""
    return _OPENAI_FINISH.get(status, "stop")


def sse_data(message: msgspec.Struct) -> bytes:
    return b"data: " + _encode(message) + b"\n\n"


class OpenAIChunks:
    """Frames one reply as OpenAI `chat.completion.chunk` events."""

    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        # A delta chunk is these bytes around its JSON-encoded text.
        head, tail = sse_data(self.chunk(ChunkDelta(content="\0"))).rsplit(b'"\\u0000"', 1)
        self._delta_head, self._delta_tail = head, tail

    def chunk(self, delta: ChunkDelta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(0, delta, finish_reason)],
            usage=None if self.include_usage else UNSET,
        )

    def frame(self, event: StreamEvent) -> bytes:
        if type(event) is Delta:  # per token: sse_data(self.chunk(...)), without the struct
            return self._delta_head + _encode(event.text) + self._delta_tail
        if isinstance(event, Start):
            return sse_data(self.chunk(ChunkDelta(role="assistant", content="")))
        return self._final(event)

    def _final(self, final: Final) -> bytes:
        if final.status is Status.FAILED:
            error = StreamErrorDetail(final.error or "generation failed", "server_error")
            return sse_data(StreamError(error)) + OPENAI_DONE
        out = sse_data(self.chunk(ChunkDelta(), openai_finish_reason(final.status)))
        if self.include_usage:
            usage = ChatCompletionChunk(
                id=self.completion_id,
                created=self.created,
                model=self.model,
                choices=[],
                usage=final.usage,
            )
            out += sse_data(usage)
        return out + OPENAI_DONE


def openai_completion(
    completion_id: str, model: str, text: str, final: Final, created: int | None = None
) -> ChatCompletion:
    """The non-streaming `chat.completion` object."""
    return ChatCompletion(
        id=completion_id,
        created=created or int(time.time()),
        model=model,
        choices=[
            CompletionChoice(0, AssistantMessage(content=text), openai_finish_reason(final.status))
        ],
        usage=final.usage,
    )
