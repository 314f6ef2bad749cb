"""The page API for finding and keeping conversations: search, export and import, and ratings of
replies. Routes only translate (the domain modules: search.py, export.py, importing.py,
ratings.py); every lookup is scoped to the logged-in user, another user's ids answer 404.

Each route's `raises=` lists what it may answer with, for the OpenAPI document: 401 for each (no
session: the router's `logged_in` guard, then `user`'s `provide_user`), 403 for each write
(Litestar's CSRF check), then the route's own refusals (and a body's 413, the database's 503:
app/domain/refusals.py).
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from litestar import Controller, Request, Response, Router, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    PermissionDeniedException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.session import Sessions
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.models import User
from app.domain.chat.conversations.service import ConversationService
from app.domain.chat.conversations.store import ConversationNotFoundError
from app.domain.chat.keep import export, importing, ratings, search
from app.domain.chat.keep.schemas import (
    EXPORT_RESPONSE,
    MAX_IMPORT_BYTES,
    RateReply,
    RatingResponse,
    SearchResult,
    SearchSnippet,
)
from app.domain.chat.models import ReplyRating
from app.domain.chat.replies.service import NotFoundError
from app.domain.chat.schemas import ConversationResponse
from app.domain.json_input import text_problem
from app.domain.refusals import documented


def download(file: export.ExportFile) -> Response[bytes]:
    return Response(file.body, media_type=file.media_type, headers=file.headers)


def rating_response(row: ReplyRating) -> RatingResponse:
    return RatingResponse(
        message_id=str(row.message_id),
        rating=str(row.rating),
        comment=row.comment,
        updated_at=row.updated_at.isoformat(),
    )


class ArchiveController(Controller):
    path = "/conversations"

    @get("/search", raises=documented(NotAuthorizedException, ClientException))
    async def search_conversations(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        q: Annotated[str, QueryParameter(max_length=search.MAX_QUERY_CHARS)] = "",
    ) -> list[SearchResult]:
        """The user's conversations whose title or messages contain `q` (ignoring case)."""
        if (problem := text_problem(q)) is not None:
            raise ClientException(f"q: {problem}")
        hits = await search.search_conversations(sessions, user.id, q)
        return [
            SearchResult(
                conversation_id=str(hit.conversation.id),
                title=hit.conversation.title,
                updated_at=hit.conversation.updated_at.isoformat(),
                message_id=str(hit.message_id) if hit.message_id else None,
                snippet=SearchSnippet(hit.snippet.before, hit.snippet.match, hit.snippet.after),
                archived=hit.conversation.archived_at is not None,
            )
            for hit in hits
        ]

    @get(
        "/{conversation_id:uuid}/export",
        responses=EXPORT_RESPONSE,
        raises=documented(NotAuthorizedException, ConversationNotFoundError),
    )
    async def export_conversation(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
        fmt: Annotated[export.ExportFormat, QueryParameter(name="format")] = "json",
    ) -> Response[bytes]:
        """Download the conversation as Markdown or as JSON (which import reads back)."""
        rows = await export.conversation_rows(sessions, conversation_id, user.id)
        if rows is None:
            raise ConversationNotFoundError(conversation_id)
        return download(export.render(*rows, fmt))

    @post(
        "/import",
        status_code=HTTP_201_CREATED,
        # the body is read raw: its 400 is the import's own (not an export), not Litestar's
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            importing.ImportRefusedError,
            RequestEntityTooLarge,
        ),
        request_max_body_size=MAX_IMPORT_BYTES,  # 413 beyond (litestar/connection/request.py)
    )
    async def import_conversation(
        self,
        request: Request,
        conversation_service: NamedDependency[ConversationService],
        user: NamedDependency[User],
    ) -> ConversationResponse:
        """A JSON export, read back strictly, as a new conversation of the user's."""
        conversation_export = importing.decode_export(await request.body())
        imported = await conversation_service.import_export(user.id, conversation_export)
        return ConversationResponse.of(imported)

    @get(
        "/{conversation_id:uuid}/ratings",
        raises=documented(NotAuthorizedException, ConversationNotFoundError),
    )
    async def ratings(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
    ) -> list[RatingResponse]:
        """The user's ratings of this conversation's replies."""
        rows = await ratings.conversation_ratings(sessions, user.id, conversation_id)
        if rows is None:
            raise ConversationNotFoundError(conversation_id)
        return [rating_response(row) for row in rows]


class RatingController(Controller):
    path = "/messages"

    @put(
        "/{message_id:uuid}/rating",
        raises=documented(
            NotAuthorizedException, PermissionDeniedException, NotFoundError, RequestEntityTooLarge
        ),
    )
    async def rate(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
        data: JSONBody[RateReply],
    ) -> RatingResponse:
        """Rate a reply (thumbs up or down, an optional comment); rating again replaces it."""
        row = await ratings.rate_reply(sessions, user.id, message_id, data.rating, data.comment)
        return rating_response(row)

    @delete(
        "/{message_id:uuid}/rating",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundError),
    )
    async def unrate(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        message_id: FromPath[UUID],
    ) -> None:
        """Take a rating back (404 when there is none)."""
        if not await ratings.remove_rating(sessions, user.id, message_id):
            raise NotFoundError(message_id)


archive_router = Router(
    "/api",
    route_handlers=[ArchiveController, RatingController],
    guards=[logged_in],
    dependencies={"user": Provide(provide_user)},
    tags=["chat"],
)
