"""The `/v1` protocol: the request of `/v1/chat/completions`, the model list, OpenAI's error shape.

(The completion and its chunks are framed by the streaming core: app/streaming/framing.py.)"""

from __future__ import annotations

from typing import Any

import msgspec


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


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(msgspec.Struct):
    """OpenAI's error shape, as `openai_error` builds it: for the OpenAPI document."""

    error: OpenAIErrorDetail


def openai_error(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
