"""Admin-only routes (`/admin`): the guard answers 401 without a session and 403 for non-admins
(and Litestar's CSRF check a write without its token); each route's `raises=` lists those
and its own refusals (and the database's 503: app/domain/refusals.py), for the OpenAPI document."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any
from uuid import UUID

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException, NotFoundException, PermissionDeniedException
from litestar.params import FromPath, QueryParameter

from app.db.session import Sessions
from app.domain.accounts.guards import admin_guard
from app.domain.admin.acting import acting_admin, record_look
from app.domain.admin.views import kill_reply, live_generations, message_row
from app.domain.chat.keep import export
from app.domain.chat.keep.schemas import EXPORT_RESPONSE
from app.domain.chat.replies import rows as reply_rows
from app.domain.chat.replies.service import ReplyService
from app.domain.refusals import documented
from app.engine import Engine


class AdminApiController(Controller):
    path = "/admin/api"
    guards = [admin_guard]
    tags = ["admin"]

    @get("/engine", raises=documented(NotAuthorizedException, PermissionDeniedException))
    async def engine_stats(self, engine: NamedDependency[Engine]) -> dict[str, Any]:
        stats = engine.stats()
        return {**dataclasses.asdict(stats), "extra": dict(stats.extra)}

    @get("/live", raises=documented(NotAuthorizedException, PermissionDeniedException))
    async def live(self, replies: NamedDependency[ReplyService]) -> list[dict[str, Any]]:
        return live_generations(replies.manager)

    @post(
        "/live/{message_id:uuid}/kill",
        status_code=200,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundException),
    )
    async def kill(
        self, request: Request, replies: NamedDependency[ReplyService], message_id: FromPath[UUID]
    ) -> dict[str, Any]:
        """The kill switch: abort a reply on whichever replica runs it (audited)."""
        by = await acting_admin(request, replies.sessions)
        status = await kill_reply(replies, message_id, by)
        if status is None:
            raise NotFoundException("no such reply")
        return {"message_id": str(message_id), "status": status}

    @get(
        "/messages/{message_id:uuid}",
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundException),
    )
    async def message(
        self, sessions: NamedDependency[Sessions], message_id: FromPath[UUID]
    ) -> dict[str, Any]:
        """Any reply with its timings and stream-health verdict."""
        message = await reply_rows.get_message_unscoped(sessions, message_id)
        if message is None:
            raise NotFoundException("no such message")
        row = message_row(message)
        return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}

    @get(
        "/conversations/{conversation_id:uuid}/export",
        responses=EXPORT_RESPONSE,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundException),
    )
    async def export_conversation(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        conversation_id: FromPath[UUID],
        fmt: Annotated[export.ExportFormat, QueryParameter(name="format")] = "json",
    ) -> Response[bytes]:
        """Any user's conversation as Markdown or JSON (the same file its owner downloads)."""
        rows = await export.conversation_rows(sessions, conversation_id, user_id=None)
        if rows is None:
            raise NotFoundException("no such conversation")
        await record_look(
            request, sessions, "export_conversation", rows[0].user_id, conversation_id
        )
        file = export.render(*rows, fmt)
        return Response(file.body, media_type=file.media_type, headers=file.headers)
