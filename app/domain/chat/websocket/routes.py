"""The page's WebSocket (`/ws`): the same reply events as the SSE stream, as JSON, both ways.

The client sends `send`, `cancel`, `resume`, `regenerate` and `edit`; the server sends `start`,
`delta`, `final`/`error` (the same payloads as the SSE events, with `type` and `id`), `ping` when idle, and
`rejected` for a request it cannot serve. Receiving runs while replies stream (each reply has its own sending task),
so a `cancel` lands mid-stream. A bad frame (not a JSON object, nested too deeply, text that cannot
be stored, a binary frame) gets one `rejected` answer (status 400); the socket and the replies
streaming on it carry on. After a `subscribe`, the socket is also the page's push channel: its
user's events as `event` frames (app/domain/chat/push/events.py). When the session ends (the account
disabled, deleted, its password reset, logged out everywhere: app/domain/chat/sign_outs.py), the
socket refuses new frames (401), lets its replies send their (cancelled) `final`s, and closes
with 4401.

Like the SSE routes, this only translates: frames are decoded into the protocol's structs
(app/domain/chat/websocket/frames.py), dispatched by their type to the reply service, and what it returns
is sent as the server's frames (the same module).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from litestar import WebSocket, websocket
from litestar.di import NamedDependency
from msgspec import UNSET

from app.db.session import Sessions
from app.domain.accounts.dependencies import logged_in_user
from app.domain.accounts.login import EPOCH_KEY, session_row
from app.domain.accounts.models import User
from app.domain.chat.push.events import PushEvent, SignedOut, UserPush
from app.domain.chat.replies.frames import page_ws
from app.domain.chat.replies.service import ReplyEvents, ReplyService
from app.domain.chat.sign_outs import SignOuts
from app.domain.chat.websocket.frames import (
    PING,
    CancelFrame,
    ClientFrame,
    EditFrame,
    RegenerateFrame,
    RejectedFrame,
    ResumeFrame,
    SendFrame,
    SubscribeFrame,
    encode,
    event_frame,
    read_frame,
)
from app.domain.errors import InvalidInputError, NotLoggedInError
from app.domain.json_input import BadJsonError
from app.domain.refusals import refusal_for
from app.streaming.push import PushChannel

log = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # wrong origin
CLOSE_UNAUTHORIZED = 4401  # no logged-in user, or signed out since
DRAIN_S = 2.0  # at a sign-out, how long the replies on the socket get to send their ends


def same_origin(socket: WebSocket) -> bool:
    """Cookies ride along on cross-site WebSocket handshakes: only our own pages may connect."""
    origin = socket.headers.get("origin")
    if origin is None:  # not a browser (a browser always sends Origin on WebSockets)
        return True
    host = socket.headers.get("x-forwarded-host") or socket.headers.get("host", "")
    return urlsplit(origin).netloc == host


def rejection(exc: Exception, frame: object) -> tuple[str, int | None]:
    """The `rejected` frame's error and status for a frame that failed: the one place where the
    WebSocket translates an error. A refusal carries both (app/domain/refusals.py), as over
    HTTP, a frame the socket could not read and a busy database included; anything else is a
    bug, a 500."""
    refusal = refusal_for(exc)
    if refusal is not None:
        return refusal.message, refusal.status
    log.error("the WebSocket request %r failed", frame, exc_info=exc)
    return "internal server error", 500


class ChatSocket:
    def __init__(
        self,
        socket: WebSocket,
        user: User,
        replies: ReplyService,
        push: UserPush | None = None,
        sign_outs: SignOuts | None = None,
    ) -> None:
        self.socket = socket
        self.user = user
        self.replies = replies
        self.push = push
        self.sign_outs = sign_outs
        self._subscribed = False
        self._signed_out = False
        self._closing: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._streams: set[asyncio.Task[None]] = set()
        self._channels: list[PushChannel[PushEvent]] = []  # its subscription's, once subscribed
        self._handlers: dict[type[Any], Callable[[Any], Awaitable[None]]] = {
            SendFrame: self.on_send,
            RegenerateFrame: self.on_regenerate,
            CancelFrame: self.on_cancel,
            ResumeFrame: self.on_resume,
            EditFrame: self.on_edit,
            SubscribeFrame: self.on_subscribe,
        }

    async def send(self, frame: bytes) -> None:
        """One encoded frame (app/domain/chat/websocket/frames.py), as a text frame."""
        async with self._send_lock:
            await self.socket.send_text(frame)

    async def run(self) -> None:
        watching = (
            self.sign_outs.watch(
                self.user.id,
                self.socket.session.get(EPOCH_KEY, 0),
                self.sign_out,
                session_row(self.socket),
            )
            if self.sign_outs is not None
            else contextlib.nullcontext()
        )
        try:
            with watching:
                while True:
                    event = await self.socket.receive()
                    if event["type"] == "websocket.disconnect":
                        return
                    await self.answer(event.get("text"))
        finally:
            for task in self._streams:
                task.cancel()  # each task's cleanup tells its reply that the client is gone

    def sign_out(self, reason: str) -> None:
        """The account was signed out (app/domain/chat/sign_outs.py): end this socket."""
        self._signed_out = True
        for channel in self._channels:  # one session's end: nothing else ended its subscription
            channel.end(SignedOut(reason))
        self._closing = asyncio.create_task(self._close_signed_out(reason), name="ws-sign-out")

    async def _close_signed_out(self, reason: str) -> None:
        # The replies are being stopped: their `final`s (and the push channel's `signed_out`)
        # go out first, so the page shows them stopped before it goes to the log-in page.
        if self._streams:
            await asyncio.wait(set(self._streams), timeout=DRAIN_S)
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.socket.close(CLOSE_UNAUTHORIZED, f"signed out ({reason})")

    async def answer(self, text: str | None) -> None:
        """Serve one frame. One that fails gets one `rejected` answer; the socket and its other
        replies go on."""
        frame: ClientFrame | None = None
        try:
            if text is None:
                raise BadJsonError("expected JSON text frames, not binary ones")
            frame = read_frame(text)
            if self._signed_out:
                raise NotLoggedInError()
            await self._handlers[type(frame)](frame)
        except Exception as exc:
            client_ref = frame.client_ref if frame is not None else getattr(exc, "client_ref", None)
            error, status = rejection(exc, frame)
            await self.send(
                encode(RejectedFrame(error, client_ref, UNSET if status is None else status))
            )

    async def on_send(self, frame: SendFrame) -> None:
        if frame.conversation_id is None:
            raise InvalidInputError("conversation_id is required")
        reply = await self.replies.send(self.user.id, frame.conversation_id, frame, transport="ws")
        self.stream(reply, frame.client_ref)

    async def on_regenerate(self, frame: RegenerateFrame) -> None:
        reply = await self.replies.regenerate(self.user.id, frame.message_id, frame, transport="ws")
        self.stream(reply, frame.client_ref)

    async def on_edit(self, frame: EditFrame) -> None:
        reply = await self.replies.edit(self.user.id, frame.message_id, frame, transport="ws")
        self.stream(reply, frame.client_ref)

    async def on_cancel(self, frame: CancelFrame) -> None:
        # Not waiting for the end: the socket keeps receiving; the reply's own stream carries it.
        await self.replies.cancel(self.user.id, frame, wait_s=0)

    async def on_resume(self, frame: ResumeFrame) -> None:
        self.stream(
            await self.replies.resume(self.user.id, frame, transport="ws"), frame.client_ref
        )

    async def on_subscribe(self, frame: SubscribeFrame) -> None:
        if self.push is not None and not self._subscribed:  # once per socket
            self._subscribed = True
            events = self.push.page_events(
                self.user.id, self.replies.keepalive_s, subscribed=self._channels.append
            )
            self.push_events(events)

    def stream(self, reply: ReplyEvents, client_ref: str | None) -> None:
        task = asyncio.create_task(self._pump_to_socket(reply, client_ref))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _pump_to_socket(self, reply: ReplyEvents, client_ref: str | None) -> None:
        events = reply.events
        with contextlib.suppress(Exception):  # a dead socket ends this stream, not the others
            async with aclosing(events):
                async for event in events:
                    frame = PING if event is None else page_ws(event, reply.message_id, client_ref)
                    await self.send(frame)

    def push_events(self, events: AsyncGenerator[PushEvent | None, None]) -> None:
        """The user's events (app/domain/chat/push/events.py) as `event` frames on this socket,
        for as long as it is open."""
        task = asyncio.create_task(self._pump_events(events))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _pump_events(self, events: AsyncGenerator[PushEvent | None, None]) -> None:
        with contextlib.suppress(Exception):  # a dead socket ends this, not the socket's replies
            async with aclosing(events):
                async for event in events:
                    await self.send(PING if event is None else event_frame(event))


@websocket("/ws")
async def chat_socket(
    socket: WebSocket[UUID | None, Any, Any],
    sessions: NamedDependency[Sessions],
    replies: NamedDependency[ReplyService],
    push: NamedDependency[UserPush],
    sign_outs: NamedDependency[SignOuts],
) -> None:
    await socket.accept()
    if not same_origin(socket):
        await socket.close(CLOSE_POLICY, "cross-origin WebSocket refused")
        return
    # Closed after the handshake, with a code the page can tell apart (a guard's refusal would
    # close it before accepting, which a browser reports as a bare failure).
    user = await logged_in_user(socket, sessions)
    if user is None:
        await socket.close(CLOSE_UNAUTHORIZED, "log in first")
        return
    await ChatSocket(socket, user, replies, push, sign_outs).run()
