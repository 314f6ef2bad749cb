"""Admin-only routes (`/admin`): the guard answers 401 without a session and 403 for non-admins."""

from __future__ import annotations

import dataclasses
from typing import Any

from litestar import Controller, Request, get, post
from litestar.exceptions import NotFoundException

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

    @post("/live/{message_id:str}/kill", status_code=200)
    async def kill(self, request: Request, message_id: str) -> dict[str, Any]:
        if not services_of(request).manager.cancel(message_id, CancelCause.ADMIN):
            raise NotFoundException("no live generation with this id")
        return {"message_id": message_id, "status": "cancelling"}
