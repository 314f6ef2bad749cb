"""The page's chat API over HTTP: conversations, and replies as server-sent events.

Routes only translate: decode the request into the protocol's structs (app/domain/chat/schemas.py),
call the reply service or the conversation queries, and frame the answer. Every lookup is scoped
to the logged-in user; another user's ids answer 404, like missing ones (the domain's not-found
errors, answered by the app's exception map).

Each route's `raises=` lists what it may answer with, for the OpenAPI document: 401 for each (no
session: the router's `logged_in` guard, then `user`'s `provide_user`), 403 for each write
(Litestar's CSRF check), then the route's own refusals (and a body's 413, the database's 503:
app/domain/refusals.py).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec
from litestar import Controller, Request, Router, delete, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    PermissionDeniedException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.response import Stream
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.session import Sessions
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.models import User
from app.domain.chat.conversations import branches
from app.domain.chat.conversations import store as conversations
from app.domain.chat.conversations.service import ConversationService
from app.domain.chat.prompts import fitting
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies.errors import START_REFUSALS, NotFoundError
from app.domain.chat.replies.frames import page_sse
from app.domain.chat.replies.service import ReplyEvents, ReplyService
from app.domain.chat.schemas import (
    CancelReply,
    ClientMetrics,
    ConversationChanges,
    ConversationResponse,
    ConversationWithMessages,
    NewConversation,
    ReplyOptions,
    ResumeReply,
    SendMessage,
    SendTurn,
    ShowBranch,
    StopResult,
)
from app.domain.errors import InvalidInputError, NotLoggedInError
from app.domain.refusals import documented
from app.domain.sse import LONG_LIVED, sse_response


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

PAGE, MAX_PAGE = 100, 500
"""Messages per page of GET /api/conversations/{id}, and conversations per page of the list: by
default, and at most."""

CANCEL_WAIT_S = 5.0
"""How long POST .../cancel waits for the reply's end to be saved before answering."""


def event_stream(reply: ReplyEvents) -> Stream:
    """The reply's events as the page's server-sent events (app/domain/chat/replies/frames.py)."""
    return sse_response(reply.events, functools.partial(page_sse, message_id=reply.message_id))


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
    path = "/conversations"

    # Its 400 (a bad page key) is documented by Litestar's own entry for the query's validation:
    # a second 400 class would make the document's 400 a `oneOf` of two identical shapes.
    @get("/", raises=documented(NotAuthorizedException, InvalidInputError))
    async def list_conversations(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        after: Annotated[datetime | None, QueryParameter()] = None,
        after_id: Annotated[UUID | None, QueryParameter()] = None,
        after_pinned: Annotated[datetime | None, QueryParameter()] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = PAGE,
        archived: Annotated[bool, QueryParameter()] = False,
    ) -> list[ConversationResponse]:
        """The newest `limit` conversations, the pinned ones first (newest pin first), archived
        ones left out; with `after` and `after_id` (the `updated_at` and `id` of the last one
        listed, and `after_pinned`, its `pinned_at`, when it was pinned), the `limit` after it:
        the sidebar's next page. With `archived=true`, the archived ones, paged the same way."""
        if (after is None) != (after_id is None):
            raise InvalidInputError("give after and after_id together (the last one listed)")
        key = None
        if after is not None and after_id is not None:
            key = conversations.ListKey(after, after_id, None if archived else after_pinned)
        rows = await conversations.list_conversations(
            sessions, user.id, source="page", limit=limit, after=key, archived=archived
        )
        return [ConversationResponse.of(c) for c in rows]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        raises=documented(NotAuthorizedException, PermissionDeniedException, RequestEntityTooLarge),
    )
    async def create(
        self,
        conversation_service: NamedDependency[ConversationService],
        user: NamedDependency[User],
        data: JSONBody[NewConversation | None] = None,
    ) -> ConversationResponse:
        title = data.title if data else None
        return ConversationResponse.of(await conversation_service.create(user.id, title))

    @get(
        "/{conversation_id:uuid}",
        raises=documented(
            NotAuthorizedException, conversations.ConversationNotFoundError, branches.NotShownError
        ),
    )
    async def read(
        self,
        sessions: NamedDependency[Sessions],
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
        before: Annotated[UUID | None, QueryParameter()] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = PAGE,
    ) -> ConversationWithMessages:
        """The conversation with the newest `limit` messages of the branch shown (oldest first),
        or the `limit` before the message `before`; `earlier` counts the messages before them.
        A huge conversation thus arrives, and is drawn, a page at a time (409: `before` is not on
        the branch shown any more). `context`: what the next message may hold."""
        thread = await branches.visible_thread(sessions, user.id, conversation_id)
        shown = ConversationWithMessages.of_thread(thread, thread.page(before, limit))
        engine, limits = replies.manager.engine, replies.limits
        shown.context = await fitting.context_limits(sessions, engine, limits, conversation_id)
        return shown

    @patch(
        "/{conversation_id:uuid}/branch",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            conversations.ConversationNotFoundError,
            branches.UnknownBranchError,
            RequestEntityTooLarge,
        ),
    )
    async def show_branch(
        self,
        conversation_service: NamedDependency[ConversationService],
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
        data: JSONBody[ShowBranch],
    ) -> ConversationWithMessages:
        """Show another version (the branch through `message_id`, to its newest end): the
        conversation as it reads now. The next turn follows it; the user's other pages showing
        the conversation hear of it (push event `branch_shown`) and re-render it."""
        thread = await conversation_service.show_branch(user.id, conversation_id, data.message_id)
        shown = ConversationWithMessages.of_thread(thread)
        engine, limits = replies.manager.engine, replies.limits
        shown.context = await fitting.context_limits(
            replies.sessions, engine, limits, conversation_id
        )
        return shown

    @patch(
        "/{conversation_id:uuid}",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            conversations.ConversationNotFoundError,
            conversations.PinnedAndArchivedError,
            RequestEntityTooLarge,
        ),
    )
    async def change(
        self,
        conversation_service: NamedDependency[ConversationService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
        data: JSONBody[ConversationChanges],
    ) -> ConversationResponse:
        """Rename (`title`), pin or unpin (`pinned`), archive or unarchive (`archived`); a field
        left out stays. Archiving unpins, pinning unarchives; both true at once is a 400."""
        changed = await conversation_service.change(user.id, conversation_id, data)
        return ConversationResponse.of(changed)

    @delete(
        "/{conversation_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            conversations.ConversationNotFoundError,
        ),
    )
    async def remove(
        self,
        conversation_service: NamedDependency[ConversationService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
    ) -> None:
        await conversation_service.delete(user.id, conversation_id)

    @post(
        "/{conversation_id:uuid}/messages",
        status_code=200,
        responses=EVENT_STREAM_RESPONSE,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            NotLoggedInError,
            conversations.ConversationNotFoundError,
            branches.UnknownBranchError,
            branches.StaleBranchError,
            *START_REFUSALS,
            RequestEntityTooLarge,
        ),
        opt=LONG_LIVED,
    )
    async def send(
        self,
        request: Request[UUID, Any, Any],
        replies: NamedDependency[ReplyService],
        conversation_id: FromPath[UUID],
        data: JSONBody[SendTurn],
    ) -> Stream:
        """Send a message, after `parent_id` (the last message the page shows; left out: the
        branch the server shows); the answer is the reply as server-sent events. 404: the
        parent is not a message of this conversation; 409: something follows it already (the
        page missed a turn added elsewhere: reload the conversation)."""
        # The user's row is read by the send's own query (ReplyService.send), not separately:
        # the user id is the session's (`request.user`), and Litestar resolves only the
        # dependencies a handler names (`expected_dependencies`, litestar/_kwargs/kwargs_model.py),
        # so the router's `user` is not loaded here.
        return event_stream(
            await replies.send(request.user, conversation_id, data, transport="sse")
        )


class MessageController(Controller):
    path = "/messages"

    @get(
        "/{message_id:uuid}/stream",
        responses=EVENT_STREAM_RESPONSE,
        raises=documented(NotAuthorizedException, ClientException, NotFoundError),
    )
    async def resume(
        self,
        request: Request,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
        after: Annotated[int | None, QueryParameter(ge=0)] = None,
    ) -> Stream:
        """Replay what the client missed since Last-Event-ID, then continue live."""
        wanted = ResumeReply(message_id, after=last_event_id(request, after))
        return event_stream(await replies.resume(user.id, wanted, transport="sse"))

    @post(
        "/{message_id:uuid}/regenerate",
        status_code=200,
        responses=EVENT_STREAM_RESPONSE,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            NotFoundError,
            reply_rows.NotRegenerableError,
            *START_REFUSALS,
            RequestEntityTooLarge,
        ),
        opt=LONG_LIVED,
    )
    async def regenerate(
        self,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
        data: JSONBody[ReplyOptions | None] = None,
    ) -> Stream:
        """Answer the latest reply's question again; the new reply, as server-sent events, is a
        new version next to the old one (409 for a reply with turns after it, or one still
        streaming)."""
        options = data or ReplyOptions()
        return event_stream(await replies.regenerate(user.id, message_id, options, transport="sse"))

    @post(
        "/{message_id:uuid}/edit",
        status_code=200,
        responses=EVENT_STREAM_RESPONSE,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            NotFoundError,
            branches.NotEditableError,
            *START_REFUSALS,
            RequestEntityTooLarge,
        ),
        opt=LONG_LIVED,
    )
    async def edit(
        self,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
        data: JSONBody[SendMessage],
    ) -> Stream:
        """Send a new version of one of your messages; its reply streams back as server-sent
        events. The old version and its replies stay, one switch away."""
        return event_stream(await replies.edit(user.id, message_id, data, transport="sse"))

    @post(
        "/{message_id:uuid}/cancel",
        status_code=200,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundError),
        opt=LONG_LIVED,
    )
    async def cancel(
        self,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
    ) -> StopResult:
        """Stop a reply (idempotent); answers once its end state is saved."""
        return await replies.cancel(user.id, CancelReply(message_id), CANCEL_WAIT_S)

    @post(
        "/{message_id:uuid}/client-metrics",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            InvalidInputError,
            NotFoundError,
            RequestEntityTooLarge,
        ),
    )
    async def client_metrics(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
        data: JSONBody[ClientMetrics],
    ) -> None:
        """The TTFT the browser saw, to compare with the engine's (is a proxy buffering?)."""
        if not await reply_rows.record_client_ttft(sessions, user.id, message_id, data.ttft_ms):
            raise NotFoundError(message_id)


chat_router = Router(
    "/api",
    route_handlers=[ConversationController, MessageController],
    guards=[logged_in],  # every route here is the logged-in user's
    dependencies={"user": Provide(provide_user)},
    tags=["chat"],
)
