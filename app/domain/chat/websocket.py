"""The page's WebSocket (`/ws`): the same reply events as the SSE stream, as JSON, both ways.

The client sends `send`, `cancel`, `resume` and `regenerate`; the server sends `start`, `delta`,
`final`/`error` (the same payloads as the SSE events, with `type` and `id`), `ping` when idle, and
`rejected` for a request it cannot serve. Receiving runs while replies stream (each reply has its own sending task),
so a `cancel` lands mid-stream. A bad frame (not a JSON object, nested too deeply, text that cannot
be stored, a binary frame) gets one `rejected` answer (status 400); the socket and the replies
streaming on it carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import msgspec
from litestar import WebSocket, websocket
from litestar.di import Provide
from litestar.exceptions import ClientException, HTTPException

from app.domain.accounts.dependencies import socket_user
from app.domain.accounts.models import User
from app.domain.chat import conversations
from app.domain.chat.controllers import (
    ReplyOptions,
    SendMessage,
    check_content,
    regenerate_reply,
    sampling_params,
)
from app.domain.chat.models import Message
from app.domain.chat.replies import ReplyService
from app.domain.json_input import BadJsonError, decode_frame, text_problem
from app.domain.refusals import refusal_for
from app.engine import Engine
from app.settings import Settings
from app.streaming.events import CancelCause
from app.streaming.framing import page_ws
from app.streaming.generation import Generation

log = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # wrong origin
CLOSE_UNAUTHORIZED = 4401  # no logged-in user


class SendRequest(SendMessage, forbid_unknown_fields=True):
    type: str = "send"
    conversation_id: UUID | None = None
    client_ref: str | None = None


class RegenerateRequest(ReplyOptions, kw_only=True):
    type: str
    message_id: UUID
    client_ref: str | None = None


class CancelRequest(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    message_id: UUID
    client_ref: str | None = None


class ResumeRequest(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    message_id: UUID
    after: int = 0
    client_ref: str | None = None


def same_origin(socket: WebSocket) -> bool:
    """Cookies ride along on cross-site WebSocket handshakes: only our own pages may connect."""
    origin = socket.headers.get("origin")
    if origin is None:  # not a browser (a browser always sends Origin on WebSockets)
        return True
    host = socket.headers.get("x-forwarded-host") or socket.headers.get("host", "")
    return urlsplit(origin).netloc == host


def rejection(exc: Exception, kind: object) -> tuple[str, int]:
    """The `rejected` frame's error and status for a request that failed: the one place where the
    WebSocket translates an error (HTTP errors keep theirs; a domain error gets its status from
    app/domain/refusals.py, as over HTTP; anything else is a bug, a 500)."""
    if isinstance(exc, HTTPException):
        return exc.detail, exc.status_code
    if (refusal := refusal_for(exc)) is not None:
        return refusal.message, refusal.status
    log.error("the WebSocket request %r failed", kind, exc_info=exc)
    return "internal server error", 500


class ChatSocket:
    def __init__(
        self,
        socket: WebSocket,
        user: User,
        replies: ReplyService,
        settings: Settings,
        engine: Engine,
    ) -> None:
        self.socket = socket
        self.user = user
        self.replies = replies
        self.settings = settings
        self.engine = engine
        self._send_lock = asyncio.Lock()
        self._streams: set[asyncio.Task[None]] = set()

    async def send(self, payload: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.socket.send_json(payload)

    async def reject(self, error: str, client_ref: str | None = None, **extra: Any) -> None:
        await self.send({"type": "rejected", "error": error, "client_ref": client_ref, **extra})

    async def run(self) -> None:
        try:
            while True:
                event = await self.socket.receive()
                if event["type"] == "websocket.disconnect":
                    return
                text = event.get("text")
                if text is None:
                    await self.reject("expected JSON text frames, not binary ones", status=400)
                    continue
                try:
                    request = decode_frame(text)
                except BadJsonError as exc:
                    await self.reject(str(exc), status=400)
                    continue
                await self.handle(request)
        finally:
            for task in self._streams:
                task.cancel()  # each task's cleanup tells its reply that the client is gone

    async def handle(self, request: dict[str, Any]) -> None:
        kind = request.get("type")
        client_ref = request.get("client_ref")
        if not isinstance(client_ref, str) or text_problem(client_ref) is not None:
            client_ref = None  # only a ref that can be echoed back
        try:
            if (problem := text_problem(request)) is not None:
                raise ClientException(problem)  # before it reaches the engine or the database
            if kind == "send":
                await self.on_send(msgspec.convert(request, SendRequest))
            elif kind == "cancel":
                await self.on_cancel(msgspec.convert(request, CancelRequest))
            elif kind == "resume":
                await self.on_resume(msgspec.convert(request, ResumeRequest))
            elif kind == "regenerate":
                await self.on_regenerate(msgspec.convert(request, RegenerateRequest))
            else:
                await self.reject(
                    f"unknown type {kind!r}: use send, cancel, resume or regenerate", client_ref
                )
        except msgspec.ValidationError as exc:
            await self.reject(f"invalid {kind} request: {exc}", client_ref)
        except Exception as exc:  # the request fails; the socket and its other replies go on
            error, status = rejection(exc, kind)
            await self.reject(error, client_ref, status=status)

    async def on_send(self, request: SendRequest) -> None:
        if request.conversation_id is None:
            raise ClientException("conversation_id is required")
        conversation = await conversations.get_conversation(
            self.replies.sessions, self.user.id, request.conversation_id
        )
        if conversation is None:
            raise ClientException("no such conversation", status_code=404)
        content = check_content(request.content, self.settings)
        params = sampling_params(request, self.settings, self.engine.context_size)
        generation = await self.replies.start(self.user.id, conversation, content, params)
        self.stream(generation, after=0, client_ref=request.client_ref)

    async def on_regenerate(self, request: RegenerateRequest) -> None:
        generation = await regenerate_reply(
            self.replies, self.settings, self.engine, self.user, request.message_id, request
        )
        self.stream(generation, after=0, client_ref=request.client_ref)

    async def on_cancel(self, request: CancelRequest) -> None:
        reply = await self.replies.find(self.user.id, request.message_id)
        # Not awaited: the socket keeps receiving; the reply's own stream carries its end.
        task = asyncio.create_task(self.replies.stop(reply, CancelCause.USER))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def on_resume(self, request: ResumeRequest) -> None:
        reply = await self.replies.find(self.user.id, request.message_id)
        self.stream(reply, after=max(0, request.after), client_ref=request.client_ref)

    def stream(
        self, reply: Generation | Message, *, after: int, client_ref: str | None = None
    ) -> None:
        task = asyncio.create_task(self._pump_to_socket(reply, after, client_ref))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _pump_to_socket(
        self, reply: Generation | Message, after: int, client_ref: str | None
    ) -> None:
        message_id = reply.message_id if isinstance(reply, Generation) else str(reply.id)
        events = self.replies.follow(
            reply, transport="ws", after=after, keepalive_s=self.settings.keepalive_s
        )
        with contextlib.suppress(Exception):  # a dead socket ends this stream, not the others
            async with aclosing(events):
                async for event in events:
                    if event is None:
                        await self.send({"type": "ping"})
                        continue
                    payload = page_ws(event, message_id)
                    if payload["type"] == "start":
                        payload["client_ref"] = client_ref
                    await self.send(payload)


@websocket("/ws", dependencies={"user": Provide(socket_user)})
async def chat_socket(
    socket: WebSocket,
    user: User | None,
    replies: ReplyService,
    settings: Settings,
    engine: Engine,
) -> None:
    await socket.accept()
    if not same_origin(socket):
        await socket.close(CLOSE_POLICY, "cross-origin WebSocket refused")
        return
    if user is None:
        await socket.close(CLOSE_UNAUTHORIZED, "log in first")
        return
    await ChatSocket(socket, user, replies, settings, engine).run()
