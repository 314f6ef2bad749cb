"""Server-sent events for the page: a Litestar `Stream` of our framed events, set up for proxies.

`Cache-Control: no-cache` and `X-Accel-Buffering: no` keep caches and nginx from holding the
stream back; the app never compresses (no compression middleware), because a gzip stream is
flushed in blocks, not per event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from litestar.response import Stream

from app.streaming.events import StreamEvent

SSE_KEEPALIVE = b": keepalive\n\n"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LONG_LIVED = {"long_lived": True}
"""The `opt` of a route whose answer lasts as long as a reply (a stream, a wait for its end): the
app's per-user turns for writes (app/web/turns.py) leave it out."""


def sse_response(
    events: AsyncGenerator[StreamEvent | None, None], frame: Callable[[StreamEvent], bytes]
) -> Stream:
    """Frame each event; None means idle, and becomes a keepalive comment.

    `aclosing` closes the event source as soon as the response ends, however it ends (a client
    that went away cancels us mid-await): that is what tells the reply its client is gone.
    """

    async def body() -> AsyncIterator[bytes]:
        async with aclosing(events):
            async for event in events:
                yield SSE_KEEPALIVE if event is None else frame(event)

    return Stream(body(), media_type="text/event-stream", headers=STREAM_HEADERS)
