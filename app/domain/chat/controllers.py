"""The page's chat API: conversations, sending a message (SSE), resuming, stopping.

Every lookup is scoped to the logged-in user; another user's ids answer 404, like missing ones.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec
from litestar import Controller, Request, delete, get, patch, post
from litestar.di import Provide
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    ServiceUnavailableException,
)
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT, HTTP_409_CONFLICT

from app.db.session import Sessions
from app.domain.accounts.dependencies import current_user
from app.domain.accounts.models import User
from app.domain.chat import conversations, reply_rows
from app.domain.chat.models import Conversation, Message
from app.domain.chat.replies import NotFoundError, ReplyService
from app.domain.errors import InvalidInputError
from app.domain.sse import sse_response
from app.engine import Engine
from app.engine.base import SamplingParams
from app.settings import Settings
from app.streaming.events import CancelCause
from app.streaming.framing import page_sse
from app.streaming.generation import Generation


class ServerSentEvent(msgspec.Struct):
    """One event of a reply's stream; `data` is its JSON payload, `id` the character offset."""

    event: Literal["start", "delta", "final", "error"]
    id: str
    data: str


EVENT_STREAM_RESPONSE = {
    200: ResponseSpec(
        ServerSentEvent,
        media_type="text/event-stream",
        description="the reply, as server-sent events (the schema is each event's)",
        generate_examples=False,
    )
}
"""The streaming endpoints' success, for the OpenAPI document. (Not the handler's `media_type`:
Litestar would send their JSON errors with it too.)"""
# The errors each kind of endpoint answers with, for the OpenAPI document (`raises`): no session
# (401), a write without the CSRF header (403), an id that is not the user's (404), a reply that
# cannot be regenerated (409), an engine that is not taking requests (503).
READ = [NotAuthorizedException]
READ_ONE = [*READ, NotFoundException]
WRITE = [*READ, PermissionDeniedException]
WRITE_ONE = [*WRITE, NotFoundException]
START_REPLY = [*WRITE_ONE, ServiceUnavailableException]


class ConflictError(ClientException):
    """409, for the OpenAPI document (Litestar has no named exception for it)."""

    status_code = HTTP_409_CONFLICT


CANCEL_WAIT_S = 5.0
"""How long POST .../cancel waits for the reply's end to be saved before answering."""


class NewConversation(msgspec.Struct, forbid_unknown_fields=True):
    title: str | None = None


class Rename(msgspec.Struct, forbid_unknown_fields=True):
    title: Annotated[str, msgspec.Meta(max_length=500)]


class ReplyOptions(msgspec.Struct, forbid_unknown_fields=True):
    """Sampling settings a request may give for its reply (the server's defaults otherwise)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None


class SendMessage(ReplyOptions, kw_only=True):
    content: str


class ClientMetrics(msgspec.Struct):
    ttft_ms: float


def conversation_json(c: Conversation) -> dict[str, Any]:
    return {
        "id": str(c.id),
        "title": c.title,
        "source": str(c.source),
        "created_at": c.created_at.isoformat(),
        "updated_at": c.updated_at.isoformat(),
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def message_json(m: Message) -> dict[str, Any]:
    return {
        "id": str(m.id),
        "role": str(m.role),
        "content": m.content,
        "status": str(m.status),
        "finish_reason": m.finish_reason,
        "error": m.error,
        "model": m.model,
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "created_at": _iso(m.created_at),
        "first_token_at": _iso(m.first_token_at),
        "finished_at": _iso(m.finished_at),
        "ttft_ms": m.ttft_ms,
        "gap_p50_ms": m.gap_p50_ms,
        "gap_p99_ms": m.gap_p99_ms,
        "cancel_token_index": m.cancel_token_index,
        "tokens_after_cancel": m.tokens_after_cancel,
        "replaced_at": _iso(m.replaced_at),
    }


def sampling_params(data: ReplyOptions, settings: Settings, context_size: int) -> SamplingParams:
    """The request's sampling parameters, range-checked (InvalidInputError: a 400)."""
    max_tokens = data.max_tokens if data.max_tokens is not None else settings.default_max_tokens
    if not 1 <= max_tokens <= context_size:
        raise InvalidInputError(f"max_tokens must be between 1 and {context_size}")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.7 if data.temperature is None else data.temperature,
            top_p=1.0 if data.top_p is None else data.top_p,
            top_k=data.top_k or 0,
            seed=data.seed,
            stop=tuple(data.stop or ()),
        )
    except ValueError as exc:  # SamplingParams checks its own ranges (app/engine/base.py)
        raise InvalidInputError(str(exc)) from exc


def check_content(content: str, settings: Settings) -> str:
    if not content.strip():
        raise ClientException("the message is empty")
    if len(content) > settings.max_message_chars:
        raise ClientException(
            f"the message is {len(content)} characters; the limit is {settings.max_message_chars}"
        )
    return content


async def regenerate_reply(
    replies: ReplyService,
    settings: Settings,
    engine: Engine,
    user: User,
    message_id: UUID,
    options: ReplyOptions,
) -> Generation:
    """Answer a reply's question again (its refusals are answered by app/domain/refusals.py)."""
    params = sampling_params(options, settings, engine.context_size)
    try:
        return await replies.regenerate(user.id, message_id, params)
    except conversations.ConversationNotFoundError as exc:  # deleted meanwhile: its message with it
        raise NotFoundError(message_id) from exc


def last_event_id(request: Request, after: int | None) -> int:
    """Where a resuming client left off: the Last-Event-ID header, or ?after=."""
    raw = request.headers.get("last-event-id")
    if raw is None:
        return after or 0
    try:
        return max(0, int(raw))
    except ValueError as exc:
        raise ClientException("Last-Event-ID must be an event id from this stream") from exc


class ConversationController(Controller):
    path = "/api/conversations"
    tags = ["chat"]
    dependencies = {"user": Provide(current_user)}

    @get("/", raises=READ)
    async def list_conversations(self, sessions: Sessions, user: User) -> list[dict[str, Any]]:
        rows = await conversations.list_conversations(sessions, user.id, source="page")
        return [conversation_json(c) for c in rows]

    @post("/", status_code=HTTP_201_CREATED, raises=WRITE)
    async def create(
        self, sessions: Sessions, user: User, data: NewConversation | None = None
    ) -> dict[str, Any]:
        title = data.title if data else None
        conversation = await conversations.create_conversation(sessions, user.id, title)
        return conversation_json(conversation)

    @get("/{conversation_id:uuid}", raises=READ_ONE)
    async def read(self, sessions: Sessions, user: User, conversation_id: UUID) -> dict[str, Any]:
        conversation = await conversations.get_conversation(sessions, user.id, conversation_id)
        messages = await conversations.list_messages(sessions, user.id, conversation_id)
        if conversation is None or messages is None:
            raise NotFoundException("no such conversation")
        return {**conversation_json(conversation), "messages": [message_json(m) for m in messages]}

    @patch("/{conversation_id:uuid}", raises=WRITE_ONE)
    async def rename(
        self, sessions: Sessions, user: User, conversation_id: UUID, data: Rename
    ) -> dict[str, Any]:
        if not await conversations.rename_conversation(
            sessions, user.id, conversation_id, data.title
        ):
            raise NotFoundException("no such conversation")
        conversation = await conversations.get_conversation(sessions, user.id, conversation_id)
        assert conversation is not None
        return conversation_json(conversation)

    @delete("/{conversation_id:uuid}", status_code=HTTP_204_NO_CONTENT, raises=WRITE_ONE)
    async def remove(self, replies: ReplyService, user: User, conversation_id: UUID) -> None:
        deleted = await conversations.delete_conversation(
            replies.sessions, user.id, conversation_id
        )
        # Then stop what it is still generating: after the delete, so that a reply whose turn a
        # racing send wrote just before it is stopped too (its final write finds no row: a no-op).
        for generation in replies.manager.live():
            if generation.conversation_id == str(conversation_id) and generation.user_id == str(
                user.id
            ):
                generation.cancel(CancelCause.USER)
        if not deleted:
            raise NotFoundException("no such conversation")

    @post(
        "/{conversation_id:uuid}/messages",
        status_code=200,
        responses=EVENT_STREAM_RESPONSE,
        raises=START_REPLY,
    )
    async def send(
        self,
        replies: ReplyService,
        settings: Settings,
        engine: Engine,
        user: User,
        conversation_id: UUID,
        data: SendMessage,
    ) -> Stream:
        """Send a message; the answer is the reply as server-sent events."""
        conversation = await conversations.get_conversation(
            replies.sessions, user.id, conversation_id
        )
        if conversation is None:
            raise NotFoundException("no such conversation")
        content = check_content(data.content, settings)
        params = sampling_params(data, settings, engine.context_size)
        generation = await replies.start(user.id, conversation, content, params)
        events = replies.follow(
            generation, transport="sse", after=0, keepalive_s=settings.keepalive_s
        )
        return sse_response(events, functools.partial(page_sse, message_id=generation.message_id))


class MessageController(Controller):
    path = "/api/messages"
    tags = ["chat"]
    dependencies = {"user": Provide(current_user)}

    @get("/{message_id:uuid}/stream", responses=EVENT_STREAM_RESPONSE, raises=READ_ONE)
    async def resume(
        self,
        request: Request,
        replies: ReplyService,
        settings: Settings,
        user: User,
        message_id: UUID,
        after: Annotated[int | None, Parameter(query="after", ge=0)] = None,
    ) -> Stream:
        """Replay what the client missed since Last-Event-ID, then continue live."""
        reply = await replies.find(user.id, message_id)
        events = replies.follow(
            reply,
            transport="sse",
            after=last_event_id(request, after),
            keepalive_s=settings.keepalive_s,
        )
        return sse_response(events, functools.partial(page_sse, message_id=str(message_id)))

    @post(
        "/{message_id:uuid}/regenerate",
        status_code=200,
        responses=EVENT_STREAM_RESPONSE,
        raises=[*START_REPLY, ConflictError],
    )
    async def regenerate(
        self,
        replies: ReplyService,
        settings: Settings,
        engine: Engine,
        user: User,
        message_id: UUID,
        data: ReplyOptions | None = None,
    ) -> Stream:
        """Answer the latest reply's question again; the new reply, as server-sent events, takes
        the old one's place (409 for any other reply, or one still streaming)."""
        generation = await regenerate_reply(
            replies, settings, engine, user, message_id, data or ReplyOptions()
        )
        events = replies.follow(
            generation, transport="sse", after=0, keepalive_s=settings.keepalive_s
        )
        return sse_response(events, functools.partial(page_sse, message_id=generation.message_id))

    @post("/{message_id:uuid}/cancel", status_code=200, raises=WRITE_ONE)
    async def cancel(self, replies: ReplyService, user: User, message_id: UUID) -> dict[str, Any]:
        """Stop a reply (idempotent); answers once its end state is saved."""
        reply = await replies.find(user.id, message_id)
        status = await replies.stop(reply, CancelCause.USER, CANCEL_WAIT_S)
        return {"message_id": str(message_id), "status": status}

    @post("/{message_id:uuid}/client-metrics", status_code=HTTP_204_NO_CONTENT, raises=WRITE_ONE)
    async def client_metrics(
        self, sessions: Sessions, user: User, message_id: UUID, data: ClientMetrics
    ) -> None:
        """The TTFT the browser saw, to compare with the engine's (is a proxy buffering?)."""
        found = await reply_rows.record_client_ttft(sessions, user.id, message_id, data.ttft_ms)
        if not found:
            raise NotFoundException("no such message")
