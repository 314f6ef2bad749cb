"""The `/v1` protocol, as vLLM keeps it (entrypoints/openai/protocol.py): the request of
`/v1/chat/completions`, the completion and its stream's chunks, the model list, OpenAI's error
shape. Fields are in OpenAI's order: clients read them by name, but the bytes stay the same.

(app/domain/openai/chunks.py frames a reply's events as these.)"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; only text parts are supported (no images)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        if any(part.type != "text" for part in self.content):
            raise ValueError("only text content parts are supported")
        return "".join(part.text or "" for part in self.content)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct):
    """The parameters we honour; unknown OpenAI parameters are accepted and ignored."""

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    min_p: float | None = None  # not OpenAI's: llama.cpp's server takes these two as well
    repeat_penalty: float | None = None
    n: int = 1
    user: str | None = None


class ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "streamchat"


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


# -- the answer: a whole completion, or its stream's chunks -------------------------------------


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str


class ChunkDelta(msgspec.Struct):
    """What a chunk adds: the role once, at the start, then content; nothing in the last one."""

    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChunkChoice(msgspec.Struct):
    index: int
    delta: ChunkDelta
    finish_reason: str | None


class _Completion(msgspec.Struct, kw_only=True):
    """What a completion and each of its chunks begin with."""

    id: str
    object: str
    created: int
    model: str


class ChatCompletionChunk(_Completion, kw_only=True):
    object: str = "chat.completion.chunk"  # (a redefined field keeps its place)
    choices: list[ChunkChoice]
    # With `stream_options.include_usage`: null on every chunk but the last, which has only it.
    usage: dict[str, int] | UnsetType | None = UNSET


class CompletionChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(_Completion, kw_only=True):
    object: str = "chat.completion"
    choices: list[CompletionChoice]
    usage: dict[str, int]


# -- errors -------------------------------------------------------------------------------------


class StreamErrorDetail(msgspec.Struct):
    message: str
    type: str


class StreamError(msgspec.Struct):
    """A failure after the stream's 200: its last chunk before `[DONE]`, as OpenAI sends it."""

    error: StreamErrorDetail


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(msgspec.Struct):
    """OpenAI's error shape: every `/v1` error response's body."""

    error: OpenAIErrorDetail


def openai_error(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> OpenAIErrorBody:
    return OpenAIErrorBody(OpenAIErrorDetail(message, kind, param, code))
