"""The wire frames are structs (app/domain/chat/replies/frames.py, app/domain/chat/websocket/frames.py,
app/domain/openai/schemas.py); the per-token ones are written without building theirs, and must
come out byte for byte as the struct's encoding, whatever the text holds."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from app.domain.chat.push.events import ConversationRenamed, PushEvent, Resync
from app.domain.chat.replies.frames import DeltaFrame, page_frame, page_sse, page_ws, sse_bytes
from app.domain.chat.websocket.frames import PING, RejectedFrame, encode, event_frame
from app.domain.openai.chunks import OpenAIChunks
from app.domain.openai.schemas import ChunkDelta
from app.streaming.events import Delta, Final, Start, Status

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
names = st.text(max_size=20)
offsets = st.integers(0, 10**9)


@given(text=texts, message_id=names, offset=offsets)
def test_a_page_delta_is_its_struct_over_sse_and_the_websocket(
    text: str, message_id: str, offset: int
) -> None:
    delta = Delta(id=offset, text=text)
    frame = page_frame(delta, message_id)
    assert frame == DeltaFrame(offset, message_id, text)
    assert page_sse(delta, message_id) == sse_bytes(frame)
    assert page_ws(delta, message_id) == encode(frame)
    head, data = page_sse(delta, message_id).split(b"\ndata: ", 1)
    assert head == f"event: delta\nid: {offset}".encode()
    assert msgspec.json.decode(data) == {"message_id": message_id, "text": text}


@given(text=texts, model=names, completion_id=names, include_usage=st.booleans())
def test_an_openai_delta_chunk_is_its_struct(
    text: str, model: str, completion_id: str, include_usage: bool
) -> None:
    chunks = OpenAIChunks(completion_id, model, include_usage)
    struct = chunks.chunk(ChunkDelta(content=text))
    framed = chunks.frame(Delta(id=len(text), text=text))
    assert framed == b"data: " + msgspec.json.encode(struct) + b"\n\n"
    body = msgspec.json.decode(framed.removeprefix(b"data: ").removesuffix(b"\n\n"))
    assert body["choices"][0]["delta"] == {"content": text}
    assert body["model"] == model and ("usage" in body) == include_usage


def test_a_start_carries_the_client_ref_on_the_websocket_only() -> None:
    start = Start(3, "m", "c", None)
    ws = msgspec.json.decode(page_ws(start, "m", "ref-1"))
    assert ws == {
        "type": "start",
        "id": 3,
        "message_id": "m",
        "conversation_id": "c",
        "user_message_id": None,
        "offset": 3,
        "client_ref": "ref-1",
    }
    assert page_sse(start, "m") == (
        b'event: start\nid: 3\ndata: {"message_id":"m","conversation_id":"c",'
        b'"user_message_id":null,"offset":3}\n\n'
    )


def test_a_failed_reply_ends_with_an_error_frame() -> None:
    failed = Final(5, Status.FAILED, None, {}, {}, error="boom")
    assert msgspec.json.decode(page_ws(failed, "m"))["type"] == "error"
    assert page_sse(failed, "m").startswith(b"event: error\nid: 5\n")
    done = Final(5, Status.COMPLETED, "stop", {}, {})
    assert msgspec.json.decode(page_ws(done, "m"))["type"] == "final"


def test_the_socket_frames_of_its_own() -> None:
    assert PING == b'{"type":"ping"}'
    assert encode(RejectedFrame("no", "r")) == b'{"type":"rejected","error":"no","client_ref":"r"}'
    assert encode(RejectedFrame("no", None, 404)) == (
        b'{"type":"rejected","error":"no","client_ref":null,"status":404}'
    )


@given(title=names, conversation_id=names)
def test_a_push_event_frame_is_the_event_under_type_event(title: str, conversation_id: str) -> None:
    for event in (ConversationRenamed(conversation_id, title), Resync()):
        frame = msgspec.json.decode(event_frame(event))
        assert frame.pop("type") == "event"
        assert msgspec.json.decode(msgspec.json.encode(frame), type=PushEvent) == event
