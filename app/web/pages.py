"""Server-rendered pages: the chat, log-in and sign-up (the admin console has its own package)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.response import Redirect, Template
from litestar.utils.scope.state import ScopeState
from sqlalchemy import text

from app.web.auth import optional_user, services_of


def csrf_token(request: Request) -> str:
    """The token the CSRF middleware set for this request (also in the `csrftoken` cookie)."""
    return ScopeState.from_scope(request.scope).csrf_token or request.cookies.get("csrftoken", "")


def page_context(request: Request, **extra: Any) -> dict[str, Any]:
    services = services_of(request)
    return {
        "csrf_token": csrf_token(request),
        "model_name": services.engine.model_name,
        "engine_ready": services.engine_ready.is_set(),
        **extra,
    }


@get("/", include_in_schema=False)
async def chat_page(request: Request) -> Template | Redirect:
    user = await optional_user(request)
    if user is None:
        return Redirect("/login")
    user_json = {"id": str(user.id), "email": user.email, "is_admin": user.is_admin}
    return Template("chat.html", context=page_context(request, user=user_json))


@get("/login", include_in_schema=False)
async def login_page(request: Request) -> Template:
    return Template("login.html", context=page_context(request))


@get("/signup", include_in_schema=False)
async def signup_page(request: Request) -> Template:
    return Template("signup.html", context=page_context(request))


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """The process is up (liveness)."""
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> Response[dict[str, Any]]:
    """Ready to serve: model loaded and database reachable (readiness)."""
    services = services_of(request)
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
