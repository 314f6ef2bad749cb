"""`/v1/chat/completions` and `/v1/models`, authenticated by bearer API keys.

Each call is stored like a page conversation (source `api`), so it ends with a persisted status
whatever the client does. The API's disconnect grace is zero: an OpenAI client never resumes, so
closing the stream stops the engine at once (status `disconnected`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Stream

from app.db.session import Sessions
from app.domain.accounts.dependencies import api_key_user
from app.domain.accounts.models import User
from app.domain.chat import conversations
from app.domain.chat.replies import ReplyService, TooManyRepliesError
from app.domain.openai.schemas import ChatCompletionRequest, OpenAIErrorBody, openai_error
from app.domain.refusals import DOMAIN_ERRORS, refusal_for
from app.domain.sse import sse_response
from app.engine import Engine
from app.engine.base import SamplingParams
from app.settings import Settings
from app.streaming.events import Delta, Final
from app.streaming.framing import OpenAIChunks, openai_completion

ROLES = {"system", "user", "assistant"}


class OpenAIError(HTTPException):
    # A client error unless told otherwise. Litestar decides whether to log a traceback from the
    # exception's class attribute (litestar/middleware/_internal/exceptions/middleware.py,
    # handle_exception_logging), so the default must not be HTTPException's 500.
    status_code = 400

    def __init__(self, message: str, status_code: int = 400, **fields: Any) -> None:
        super().__init__(detail=message, status_code=status_code)
        self.fields = fields


def _params(body: ChatCompletionRequest, context_size: int, default_max: int) -> SamplingParams:
    if body.n != 1:
        raise OpenAIError("only n=1 is supported", param="n")
    given = (body.max_completion_tokens, body.max_tokens)
    max_tokens = next((v for v in given if v is not None), default_max)  # 0 is given, and wrong
    if not 1 <= max_tokens <= context_size:
        raise OpenAIError(f"max_tokens must be between 1 and {context_size}", param="max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            stop=tuple(stop),
        )
    except ValueError as exc:
        raise OpenAIError(str(exc)) from exc


def _messages(body: ChatCompletionRequest, max_chars: int) -> list[dict[str, str]]:
    if not body.messages:
        raise OpenAIError("messages must not be empty", param="messages")
    out = []
    for i, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise OpenAIError(
                f"messages[{i}].role {message.role!r} is not supported", param="messages"
            )
        try:
            text = message.text()
        except ValueError as exc:
            raise OpenAIError(f"messages[{i}]: {exc}", param="messages") from exc
        out.append({"role": message.role, "content": text})
    if out[-1]["role"] != "user":
        raise OpenAIError("the last message must come from the user", param="messages")
    if sum(len(m["content"]) for m in out) > max_chars * 4:
        raise OpenAIError("messages are too long", param="messages")
    return out


ERRORS = {
    400: "an invalid request (the message says what is wrong)",
    401: "no API key, or one that is not valid",
    404: "no such model",
    503: "the server is not taking requests (shutting down): try again in a moment",
}


@post(
    "/chat/completions",
    status_code=200,
    responses={
        status: ResponseSpec(OpenAIErrorBody, description=description)
        for status, description in ERRORS.items()
    },
)
async def chat_completions(
    request: Request,
    replies: ReplyService,
    settings: Settings,
    engine: Engine,
    user: User,
    data: ChatCompletionRequest,
) -> Response[Any] | Stream:
    """A chat completion, as JSON or (`stream: true`) as server-sent events, like OpenAI's.

    The body is decoded by Litestar through the app's SafeRequest (app/web/client_input.py): bad
    JSON, JSON nested too deeply and text that cannot be stored are 400s in OpenAI's shape (see
    `_error_response`), and a client that leaves mid-body is a quiet 499.
    """
    body = data
    sessions: Sessions = replies.sessions
    if body.model != engine.model_name:
        raise OpenAIError(
            f"the model {body.model!r} does not exist; GET /v1/models lists the models",
            status_code=404,
            param="model",
            code="model_not_found",
        )
    messages = _messages(body, settings.max_message_chars)
    params = _params(body, engine.context_size, settings.default_max_tokens)
    conversation = await conversations.create_conversation(
        sessions, user.id, messages[-1]["content"][:80], source="api"
    )
    try:
        generation = await replies.start(
            user.id, conversation, messages[-1]["content"], params, extra_messages=messages
        )
    except DOMAIN_ERRORS:  # refused (answered by `_error_response`): keep no empty conversation
        await conversations.delete_conversation(sessions, user.id, conversation.id)
        raise
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    model = engine.model_name
    events = replies.follow(
        generation, transport="openai", after=0, keepalive_s=settings.keepalive_s
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = OpenAIChunks(completion_id, model, include_usage)
        return sse_response(events, chunks.frame)
    return await _complete(request, events, completion_id, model)


async def _complete(
    request: Request, events: AsyncGenerator[Any, None], completion_id: str, model: str
) -> Response[Any]:
    """Collect the whole reply; a client that gives up first (it disconnects) stops it."""
    created = int(time.time())
    collector = asyncio.create_task(_collect(events))
    watcher = asyncio.create_task(_until_disconnected(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not collector.done():  # the client left: closing the stream ends the reply (grace 0)
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        return Response(openai_error("client disconnected", kind="server_error"), status_code=499)
    text, final = collector.result()
    if final is None or final.status.value == "failed":
        message = final.error if final and final.error else "generation failed"
        return Response(openai_error(message, kind="server_error"), status_code=500)
    return Response(openai_completion(completion_id, model, text, final, created))


async def _collect(events: AsyncGenerator[Any, None]) -> tuple[str, Final | None]:
    parts: list[str] = []
    final: Final | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Delta):
                parts.append(event.text)
            elif isinstance(event, Final):
                final = event
    return "".join(parts), final


async def _until_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@get("/models", responses={401: ResponseSpec(OpenAIErrorBody, description=ERRORS[401])})
async def list_models(engine: Engine, user: User) -> dict[str, Any]:
    model = engine.model_name
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "streamchat"}],
    }


def _error_response(request: Request, exc: Exception) -> Response[Any]:
    """Every error under /v1 in OpenAI's shape, so clients raise their usual exceptions."""
    status = getattr(exc, "status_code", 500)
    fields = getattr(exc, "fields", {})
    if isinstance(exc, ValidationException):
        message = f"invalid request: {exc.extra or exc.detail}"
    elif isinstance(exc, HTTPException):
        message = exc.detail
    elif (refusal := refusal_for(exc)) is not None:  # a domain error: the app's one map
        status, message = refusal.status, refusal.message
        # As OpenAI's own 429s; its other errors carry no code.
        fields = {"code": "rate_limit_exceeded" if isinstance(exc, TooManyRepliesError) else None}
    else:
        message = "internal server error"
    kind = {401: "authentication_error", 404: "invalid_request_error", 429: "requests"}.get(
        status, "invalid_request_error"
    )
    if status >= 500:
        kind = "server_error"
    return Response(openai_error(message, kind=kind, **fields), status_code=status)


openai_router = Router(
    path="/v1",
    route_handlers=[chat_completions, list_models],
    dependencies={"user": Provide(api_key_user)},
    # The domain's error classes too: Litestar picks the handler by the error's class first
    # (`get_exception_handler`, litestar/middleware/_internal/exceptions/middleware.py), so the
    # app's map would win for them.
    exception_handlers={
        Exception: _error_response,
        **dict.fromkeys(DOMAIN_ERRORS, _error_response),
    },
    tags=["openai"],
)

__all__ = ["openai_router"]
