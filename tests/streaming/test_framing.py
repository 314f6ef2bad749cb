"""The per-token framings: a delta is written without building its dict (app/streaming/framing.py),
and must come out byte for byte as the generic path writes it, whatever the text holds."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from app.streaming.events import Delta
from app.streaming.framing import OpenAIChunks, page_event, page_sse

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
names = st.text(max_size=20)


@given(text=texts, message_id=names, offset=st.integers(0, 10**9))
def test_a_page_delta_is_the_event_its_fields_say(text: str, message_id: str, offset: int) -> None:
    frame = page_sse(Delta(id=offset, text=text), message_id)
    name, event_id, payload = page_event(Delta(id=offset, text=text), message_id)
    head, data = frame.split(b"\ndata: ", 1)
    assert head == f"event: {name}\nid: {event_id}".encode()
    assert data.endswith(b"\n\n") and b"\n" not in data[:-2]
    assert msgspec.json.decode(data[:-2]) == payload == {"message_id": message_id, "text": text}


@given(text=texts, model=names, completion_id=names, include_usage=st.booleans())
def test_an_openai_delta_chunk_is_the_chunk_built_from_its_dict(
    text: str, model: str, completion_id: str, include_usage: bool
) -> None:
    chunks = OpenAIChunks(completion_id, model, include_usage)
    generic = chunks._chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
    assert chunks.frame(Delta(id=len(text), text=text)) == generic
    body = msgspec.json.decode(generic.removeprefix(b"data: ").removesuffix(b"\n\n"))
    assert body["choices"][0]["delta"] == {"content": text}
    assert body["model"] == model and ("usage" in body) == include_usage
