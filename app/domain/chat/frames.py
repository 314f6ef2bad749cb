"""The WebSocket's frames, both ways: msgspec tagged unions on `type`.

The client's are request structs of the chat protocol (app/domain/chat/schemas.py), each with a
`client_ref` of its own choosing that the server's answer echoes: the `start` of the reply it
asked for, or the `rejected` that refuses it. The server's are a reply's events (the same structs
as the SSE stream's: app/domain/chat/reply_frames.py), `ping` when idle, `rejected`, and, once the
page has subscribed, its user's push events (app/domain/chat/push_events.py) as `event` frames.

`read_frame` decodes a text frame with one msgspec decoder. A frame it cannot serve raises
`BadFrameError` carrying the frame's `client_ref` when that can be echoed; the answers are those
the socket has always given: 400 for a frame that is not a JSON object, is nested too deeply or
holds text that cannot be stored (app/domain/json_input.py), no status for an unknown `type` (the
message names the valid ones) or fields that do not fit it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
from msgspec import UNSET, UnsetType

from app.domain.chat.push_events import PushEvent
from app.domain.chat.reply_frames import PageFrame
from app.domain.chat.schemas import CancelReply, ReplyOptions, ResumeReply, SendMessage, SendTurn
from app.domain.errors import InvalidInputError
from app.domain.json_input import TOO_DEEP, BadJsonError, decode_frame, text_problem


class SendFrame(SendTurn, tag_field="type", tag="send", forbid_unknown_fields=True):
    conversation_id: UUID | None = None  # required: refused with a 400 that says so
    client_ref: str | None = None


class RegenerateFrame(
    ReplyOptions, tag_field="type", tag="regenerate", kw_only=True, forbid_unknown_fields=True
):
    message_id: UUID
    client_ref: str | None = None


class EditFrame(
    SendMessage, tag_field="type", tag="edit", kw_only=True, forbid_unknown_fields=True
):
    message_id: UUID  # the user's message this is a new version of
    client_ref: str | None = None


class CancelFrame(CancelReply, tag_field="type", tag="cancel", forbid_unknown_fields=True):
    client_ref: str | None = None


class ResumeFrame(ResumeReply, tag_field="type", tag="resume", forbid_unknown_fields=True):
    client_ref: str | None = None


class SubscribeFrame(msgspec.Struct, tag_field="type", tag="subscribe", forbid_unknown_fields=True):
    """Make this socket its page's push channel (app/domain/chat/push_events.py)."""

    client_ref: str | None = None


ClientFrame = SendFrame | RegenerateFrame | CancelFrame | ResumeFrame | EditFrame | SubscribeFrame
FRAME_TYPES = ("send", "cancel", "resume", "regenerate", "edit", "subscribe")

_decoder = msgspec.json.Decoder(ClientFrame)


class BadFrameError(InvalidInputError):
    """A frame the socket refuses before serving it; `status` None: answered without one (an
    unknown type, fields that do not fit it)."""

    def __init__(self, message: str, client_ref: str | None, status: int | None = 400) -> None:
        super().__init__(message)
        self.client_ref = client_ref
        self.status = status


def echoable(client_ref: Any) -> str | None:
    """The frame's `client_ref` if the answer can carry it back (a string that can be stored)."""
    return client_ref if isinstance(client_ref, str) and text_problem(client_ref) is None else None


def read_frame(text: str) -> ClientFrame:
    """The frame as its struct; raises BadJsonError (400) or BadFrameError saying what is wrong."""
    try:
        frame = _decoder.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _refusal(text, exc) from exc
    if (problem := text_problem(frame)) is not None:
        raise BadFrameError(problem, echoable(frame.client_ref))
    return frame


def _refusal(text: str, exc: Exception) -> Exception:
    """Why a frame did not decode, in the words the socket has always used. msgspec stops at the
    first thing it dislikes, which may not be the most telling (an unknown field before a value
    nested too deeply, a lone surrogate before the `client_ref`), so the frame is read again as
    plain JSON, and checked in order: JSON, stored text, type, fields."""
    if isinstance(exc, RecursionError):
        return BadJsonError(TOO_DEEP)
    request = decode_frame(text)  # may raise BadJsonError itself
    client_ref = echoable(request.get("client_ref"))
    if (problem := text_problem(request)) is not None:
        return BadFrameError(problem, client_ref)
    kind = request.get("type")
    if kind not in FRAME_TYPES:
        return BadFrameError(
            f"unknown type {kind!r}: use {', '.join(FRAME_TYPES[:-1])} or {FRAME_TYPES[-1]}",
            client_ref,
            status=None,
        )
    return BadFrameError(f"invalid {kind} request: {exc}", client_ref, status=None)


# -- the server's frames ------------------------------------------------------------------------


class PingFrame(msgspec.Struct, tag_field="type", tag="ping"):
    """Sent when the socket is idle: the page knows it is still alive."""


class RejectedFrame(msgspec.Struct, tag_field="type", tag="rejected"):
    """A client frame the server cannot serve: the socket and its other replies go on."""

    error: str
    client_ref: str | None  # the refused frame's, if it had one that can be echoed
    status: int | UnsetType = UNSET  # left out for a frame of an unknown type or shape


ServerFrame = PageFrame | PingFrame | RejectedFrame  # and PushEvent, as `event_frame` writes it

_encode = msgspec.json.Encoder().encode
PING = _encode(PingFrame())


def encode(frame: ServerFrame) -> bytes:
    return _encode(frame)


def event_frame(event: PushEvent) -> bytes:
    """A push event as a frame: `type` is `event`, then the event's own fields, `event` naming it
    (its tag). msgspec cannot nest one tagged struct's fields in another's, so the frame is the
    event's JSON object with `type` written in front."""
    return b'{"type":"event",' + _encode(event)[1:]
