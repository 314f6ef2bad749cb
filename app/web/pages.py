"""Server-rendered pages: the chat (or, for an account an admin has not approved yet, the page that
says so), log-in, sign-up and password reset (the admin console has its own package)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from sqlalchemy import text

from app.db.session import Sessions
from app.domain.accounts.authentication import PENDING
from app.domain.accounts.dependencies import logged_in_user
from app.settings import Settings
from app.web.services import Services
from app.web.session_store import session_store_check


def engine_info(context: Mapping[str, Any], /) -> dict[str, Any]:
    """What any page may show of the engine, called from a template as `engine_info()`: its model
    and whether it is loaded yet. A template callable takes the context Litestar renders with, which
    holds the request (litestar/response/template.py `create_template_context`)."""
    services: Services = context["request"].app.state.services
    return {"model_name": services.engine.model_name, "ready": services.engine_ready.is_set()}


def register_page_callables(engine: JinjaTemplateEngine) -> None:
    """`TemplateConfig.engine_callback`: the page context every template can call, beside
    Litestar's own `csrf_token()` (litestar/template/base.py, registered for Jinja in
    litestar/plugins/jinja.py), so handlers pass only their own context."""
    engine.register_template_callable("engine_info", engine_info)


@get("/", include_in_schema=False)
async def chat_page(
    request: Request[UUID | None, Any, Any], sessions: NamedDependency[Sessions]
) -> Template | Redirect:
    if request.auth == PENDING:  # signed up under SIGNUP_MODE=approval; no admin said yes yet
        return Template("waiting.html")
    user = await logged_in_user(request, sessions)
    if user is None:
        return Redirect("/login")
    user_json = {"id": str(user.id), "email": user.email, "is_admin": user.is_admin}
    return Template("chat.html", context={"user": user_json})


@get("/login", include_in_schema=False)
async def login_page(settings: NamedDependency[Settings]) -> Template:
    return Template("login.html", context={"signup_mode": settings.signup_mode})


@get("/signup", include_in_schema=False)
async def signup_page(settings: NamedDependency[Settings]) -> Template:
    return Template("signup.html", context={"signup_mode": settings.signup_mode})


@get("/reset", include_in_schema=False)
async def reset_page() -> Template:
    """The form a password-reset link opens; the link's secret is in its fragment (#token=...),
    which browsers never send, so it stays out of every access log (static/js/reset.js)."""
    return Template("reset.html")


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """The process is up (liveness)."""
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(request: Request, services: NamedDependency[Services]) -> Response[dict[str, Any]]:
    """Ready to serve (readiness): model loaded, database reachable and taking writes, and the
    session store reachable too."""
    checks: dict[str, str] = {}
    checks["model"] = (
        "loaded"
        if services.engine_ready.is_set()
        else (f"failed: {services.engine_error}" if services.engine_error else "loading")
    )
    if checks["model"] == "loaded" and (why := services.engine.stats().unavailable):
        checks["model"] = f"unavailable: {why}"  # e.g. every upstream inference server is down
    if checks["model"] == "loaded" and (degraded := services.engine.stats().degraded):
        checks["degraded"] = degraded  # still ready (200): e.g. some upstream servers are down
    try:
        async with services.sessions() as session:
            await session.execute(text("SELECT 1"))
        refusing = await services.storage.check(services.db_engine)  # disk full, read-only
        checks["database"] = f"refusing writes: {refusing}" if refusing else "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    store = await session_store_check(request.app.stores.get("sessions"))
    if store is not None:  # shared between replicas (SESSION_STORE_URL)
        checks["session_store"] = store
    ready = checks["model"] == "loaded" and checks["database"] == "ok" and store in (None, "ok")
    return Response({"ready": ready, **checks}, status_code=200 if ready else 503)
