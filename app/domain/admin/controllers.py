"""Admin-only routes (`/admin`): the guard answers 401 without a session and 403 for non-admins."""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

from litestar import Controller, Request, get, post
from litestar.exceptions import NotFoundException

from app.domain.chat import service as chat_service
from app.streaming.events import CancelCause
from app.web.auth import admin_guard, services_of


def live_json(services: Any) -> list[dict[str, Any]]:
    return [
        {
            "message_id": g.message_id,
            "conversation_id": g.conversation_id,
            "user_id": g.user_id,
            "source": g.source,
            "status": g.status.value,
            "tokens": g.tokens,
            "length": g.length,
            "subscribers": len(g.subscribers),
            "started_at": g.created_at,
        }
        for g in services.manager.live()
    ]


class AdminApiController(Controller):
    path = "/admin/api"
    guards = [admin_guard]
    tags = ["admin"]

    @get("/engine")
    async def engine_stats(self, request: Request) -> dict[str, Any]:
        stats = services_of(request).engine.stats()
        return {**dataclasses.asdict(stats), "extra": dict(stats.extra)}

    @get("/live")
    async def live(self, request: Request) -> list[dict[str, Any]]:
        return live_json(services_of(request))

    @post("/live/{message_id:uuid}/kill", status_code=200)
    async def kill(self, request: Request, message_id: UUID) -> dict[str, Any]:
        """The kill switch: abort a reply on whichever replica runs it."""
        services = services_of(request)
        message = await chat_service.get_message_unscoped(services.sessions, message_id)
        if message is None or str(message.role) != "assistant":
            raise NotFoundException("no such reply")
        reply = services.manager.get(str(message_id)) or message
        status = await services.replies.stop(reply, CancelCause.ADMIN)
        return {"message_id": str(message_id), "status": status}
