"""Server-rendered pages: the chat, log-in and sign-up (the admin console has its own package)."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.di import Provide
from litestar.response import Redirect, Template
from sqlalchemy import text

from app.domain.accounts.dependencies import optional_user
from app.domain.accounts.models import User
from app.web.services import Services


@get("/", include_in_schema=False, dependencies={"user": Provide(optional_user)})
async def chat_page(user: User | None, page_globals: dict[str, Any]) -> Template | Redirect:
    if user is None:
        return Redirect("/login")
    user_json = {"id": str(user.id), "email": user.email, "is_admin": user.is_admin}
    return Template("chat.html", context={**page_globals, "user": user_json})


@get("/login", include_in_schema=False)
async def login_page(page_globals: dict[str, Any]) -> Template:
    return Template("login.html", context=page_globals)


@get("/signup", include_in_schema=False)
async def signup_page(page_globals: dict[str, Any]) -> Template:
    return Template("signup.html", context=page_globals)


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """The process is up (liveness)."""
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(services: Services) -> Response[dict[str, Any]]:
    """Ready to serve: model loaded and database reachable (readiness)."""
    checks: dict[str, str] = {}
    checks["model"] = (
        "loaded"
        if services.engine_ready.is_set()
        else (f"failed: {services.engine_error}" if services.engine_error else "loading")
    )
    try:
        async with services.sessions() as session:
            await session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    ready = checks["model"] == "loaded" and checks["database"] == "ok"
    return Response({"ready": ready, **checks}, status_code=200 if ready else 503)
