"""`GET /api/events`: the page's push channel when it streams over SSE (over the WebSocket, the
same events ride on the socket after a `subscribe` frame: app/domain/chat/websocket/routes.py). Server-sent events named after the
event (`reply_started`, `conversation_renamed`, ...; app/domain/chat/push/events.py), with keepalive
comments when idle; no ids, since a page that reconnects refetches what it shows (`resync`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from litestar import Request, get
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotAuthorizedException
from litestar.response import Stream

from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.login import EPOCH_KEY, session_row
from app.domain.accounts.models import User
from app.domain.chat.push.events import PushEvent
from app.domain.chat.sign_outs import SignOuts
from app.domain.refusals import documented
from app.domain.sse import SSE_KEEPALIVE, STREAM_HEADERS
from app.settings import Settings

_encode = msgspec.json.Encoder().encode


def sse_frame(event: PushEvent) -> bytes:
    name = type(event).__struct_config__.tag
    return b"event: %s\ndata: %s\n\n" % (str(name).encode(), _encode(event))


@get(
    "/api/events",
    guards=[logged_in],
    dependencies={"user": Provide(provide_user)},
    raises=documented(NotAuthorizedException),
    # Like /ws, not in the OpenAPI document: an endless stream, which a client generated from the
    # document (or the schema fuzzer, tests/serving/test_api_fuzz.py) would read forever.
    include_in_schema=False,
)
async def user_events(
    request: Request,
    user: NamedDependency[User],
    sign_outs: NamedDependency[SignOuts],
    settings: NamedDependency[Settings],
) -> Stream:
    """This user's events, for one page: replies started and ended on their other pages, and
    conversations created, renamed or deleted. Nothing of any other user's. It ends with
    `signed_out` when this session ends (app/domain/chat/sign_outs.py)."""
    epoch = request.session.get(EPOCH_KEY, 0)
    events = sign_outs.page_events(user.id, epoch, settings.keepalive_s, session_row(request))

    async def body() -> AsyncIterator[bytes]:
        # The first keepalive says "subscribed". A client that goes away cancels the response:
        # `aclosing` then unsubscribes its channel.
        async with aclosing(events):
            async for event in events:
                yield SSE_KEEPALIVE if event is None else sse_frame(event)

    return Stream(body(), media_type="text/event-stream", headers=STREAM_HEADERS)
