"""A reply's events as the page receives them: a msgspec tagged union on `type`, one struct each.

Both page transports send these structs. The WebSocket sends each as its JSON object
(`{"type", "id", ...}`); the SSE stream names the event after `type`, gives `id` its own line,
and sends the rest as `data` (`sse_bytes`). `id` is the character offset where the event ends
(app/streaming/events.py), so a client resumes from the last one it saw.

Deltas are per token: `page_sse` and `page_ws` write a delta's bytes directly, without building
its struct; tests/test_reply_frames.py checks them against the structs' encoding.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from app.streaming.events import Delta, Start, Status, StreamEvent

_encode = msgspec.json.Encoder().encode  # compact UTF-8 JSON, several times faster than json.dumps


class ReplyFrame(msgspec.Struct, tag_field="type"):
    id: int
    message_id: str


class StartFrame(ReplyFrame, tag="start"):
    conversation_id: str
    user_message_id: str | None
    offset: int
    # The WebSocket's only: the `client_ref` of the frame this stream answers (null if it had none).
    client_ref: str | UnsetType | None = UNSET


class DeltaFrame(ReplyFrame, tag="delta"):
    text: str


class FinalFrame(ReplyFrame, tag="final"):
    status: str
    finish_reason: str | None
    usage: dict[str, int]
    timings: dict[str, float | None]
    error: str | None
    saved: bool
    # The context the reply used (its prompt + reply tokens: usage's total) of the engine's
    # context size (null: a reply replayed from the database): the page's context meter.
    context_tokens: int
    context_size: int | None
    # A `cancelled` reply's only: who stopped it ("user", "admin" or "signed_out").
    stopped_by: str | UnsetType = UNSET


class ErrorFrame(FinalFrame, tag="error"):
    """A reply that failed after its 200: reported in-band, as the stream's last event."""


PageFrame = StartFrame | DeltaFrame | FinalFrame | ErrorFrame


def page_frame(
    event: StreamEvent, message_id: str, client_ref: str | UnsetType | None = UNSET
) -> PageFrame:
    if isinstance(event, Start):
        return StartFrame(
            event.id,
            event.message_id,
            event.conversation_id,
            event.user_message_id,
            event.id,
            client_ref,
        )
    if isinstance(event, Delta):
        return DeltaFrame(event.id, message_id, event.text)
    ending = ErrorFrame if event.status is Status.FAILED else FinalFrame
    return ending(
        event.id,
        message_id,
        event.status.value,
        event.finish_reason,
        event.usage,
        event.timings,
        event.error,
        event.saved,
        event.usage.get("total_tokens", 0),
        event.context_size,
        UNSET if event.stopped_by is None else event.stopped_by,
    )


def sse_bytes(frame: PageFrame) -> bytes:
    """The frame as a server-sent event: `type` and `id` on their own lines, the rest as data."""
    fields = frame.__struct_fields__[1:]  # all but `id`
    data = {name: value for name in fields if (value := getattr(frame, name)) is not UNSET}
    tag = frame.__struct_config__.tag
    return b"event: %s\nid: %d\ndata: %s\n\n" % (tag.encode(), frame.id, _encode(data))


def page_sse(event: StreamEvent, message_id: str) -> bytes:
    if type(event) is Delta:  # per token: sse_bytes(DeltaFrame(...)), without the struct
        return b'event: delta\nid: %d\ndata: {"message_id":%s,"text":%s}\n\n' % (
            event.id,
            _encode(message_id),
            _encode(event.text),
        )
    return sse_bytes(page_frame(event, message_id))


def page_ws(event: StreamEvent, message_id: str, client_ref: str | None = None) -> bytes:
    """The WebSocket's frame; a start carries the `client_ref` of the frame that asked for it."""
    if type(event) is Delta:  # per token: _encode(DeltaFrame(...)), without the struct
        return b'{"type":"delta","id":%d,"message_id":%s,"text":%s}' % (
            event.id,
            _encode(message_id),
            _encode(event.text),
        )
    return _encode(page_frame(event, message_id, client_ref))
