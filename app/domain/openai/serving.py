"""`/v1/chat/completions`, served: validate the request in OpenAI's terms, store the call as an
`api` conversation, start the reply, then stream it as OpenAI's chunks or collect it whole.

As vLLM's `entrypoints/openai` splits it: the routes (app/domain/openai/controllers.py) only hand
the decoded request here; the request and error shapes live in app/domain/openai/schemas.py.
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
from uuid import UUID

from litestar import Request, Response
from litestar.response import Stream

from app.domain.chat.replies.service import ReplyService
from app.domain.chat.schemas import ReplyOptions
from app.domain.openai.chunks import OpenAIChunks, openai_completion
from app.domain.openai.errors import OpenAIError
from app.domain.openai.schemas import ChatCompletionRequest, openai_error
from app.domain.sse import sse_response
from app.engine import Engine
from app.engine.base import SamplingParams
from app.streaming.events import Delta, Final, Status, StreamEvent

ROLES = {"system", "user", "assistant"}
# OpenAI's own defaults for its fields, so a client gets what OpenAI's documentation promises;
# the settings OpenAI has no field for (min_p, repeat_penalty) keep the model's defaults
# (app/domain/chat/replies/limits.py MODEL_DEFAULTS).
OPENAI_DEFAULTS = ReplyOptions(
    temperature=1.0, top_p=1.0, frequency_penalty=0.0, presence_penalty=0.0
)


class OpenAIServingChat:
    def __init__(self, replies: ReplyService, engine: Engine) -> None:
        self.replies = replies
        self.engine = engine

    async def create(
        self, request: Request, user_id: UUID, body: ChatCompletionRequest
    ) -> Response[Any] | Stream:
        """A chat completion, as JSON or (`stream: true`) as server-sent events, like OpenAI's."""
        if body.model != self.engine.model_name:
            raise OpenAIError(
                f"the model {body.model!r} does not exist; GET /v1/models lists the models",
                status_code=404,
                param="model",
                code="model_not_found",
            )
        messages = self.messages(body)
        params = self.params(body)
        events = await self.start(user_id, messages, params)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = OpenAIChunks(completion_id, self.engine.model_name, include_usage)
            return sse_response(events, chunks.frame)
        return await self.complete(request, events, completion_id)

    def params(self, body: ChatCompletionRequest) -> SamplingParams:
        """OpenAI's parameters, checked by the domain's rules (app/domain/chat/replies/limits.py)."""
        if body.n != 1:
            raise OpenAIError("only n=1 is supported", param="n")
        given = (body.max_completion_tokens, body.max_tokens)
        options = ReplyOptions(
            max_tokens=next((v for v in given if v is not None), None),  # 0 is given, and wrong
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=[body.stop] if isinstance(body.stop, str) else body.stop,
            min_p=body.min_p,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
            repeat_penalty=body.repeat_penalty,
        )
        return self.replies.limits.sampling(
            options, self.engine.context_size, defaults=OPENAI_DEFAULTS
        )

    def messages(self, body: ChatCompletionRequest) -> list[dict[str, str]]:
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
        if sum(len(m["content"]) for m in out) > self.replies.limits.max_message_chars * 4:
            raise OpenAIError("messages are too long", param="messages")
        return out

    async def start(
        self, user_id: UUID, messages: list[dict[str, str]], params: SamplingParams
    ) -> AsyncGenerator[StreamEvent | None, None]:
        """Start the reply and store the call as an `api` conversation; its events, as they come."""
        generation = await self.replies.start_api_call(user_id, messages, params)
        return self.replies.reply_events(
            generation, transport="openai", after=0, keepalive_s=self.replies.keepalive_s
        )

    async def complete(
        self, request: Request, events: AsyncGenerator[StreamEvent | None, None], completion_id: str
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
            error = openai_error("client disconnected", kind="server_error")
            return Response(error, status_code=499)
        text, final = collector.result()
        if final is None or final.status is Status.FAILED:
            message = final.error if final and final.error else "generation failed"
            return Response(openai_error(message, kind="server_error"), status_code=500)
        model = self.engine.model_name
        return Response(openai_completion(completion_id, model, text, final, created))


async def _collect(events: AsyncGenerator[StreamEvent | None, None]) -> tuple[str, Final | None]:
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
