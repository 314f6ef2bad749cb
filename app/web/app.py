"""The Litestar app factory: plugins, middleware, routes and the lifespan, wired in one place.

    uvicorn --factory app.web.app:create_app

The lifespan builds the services (database, engine, generation manager), marks replies a dead
server left `streaming` as `interrupted`, loads the model, and on shutdown ends every open reply
with a saved state before the engine and the database go away.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from logging.handlers import QueueListener
from pathlib import Path

from litestar import Litestar, Router
from litestar.config.csrf import CSRFConfig
from litestar.datastructures import State
from litestar.logging import LoggingConfig
from litestar.middleware import DefineMiddleware
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from app.domain.accounts.authentication import (
    ACCESS_STATE_KEY,
    LIVE_SESSIONS_STATE_KEY,
    SESSIONS_STATE_KEY,
    SessionAuthenticationMiddleware,
)
from app.domain.accounts.browser_sessions import SESSION_MAX_AGE, LiveSessions
from app.domain.accounts.controllers import ApiKeyController, AuthController
from app.domain.accounts.guards import admin_guard
from app.domain.accounts.ratelimit import (
    AttemptStore,
    AuthLimits,
    MemoryAttemptStore,
    RedisAttemptStore,
)
from app.domain.accounts.trusted_header import TrustedHeaderSignIn
from app.domain.admin.controllers import AdminApiController
from app.domain.admin.pages import AdminPages
from app.domain.admin.users_api import AdminUsersApi
from app.domain.admin.users_pages import AdminUserPages
from app.domain.chat.conversations.controllers import chat_router
from app.domain.chat.keep.controllers import archive_router
from app.domain.chat.push.routes import user_events
from app.domain.chat.settings.controllers import settings_router
from app.domain.chat.websocket.routes import chat_socket
from app.domain.my_account.api import AccountApi
from app.domain.my_account.page import account_page
from app.domain.openai.controllers import openai_router
from app.domain.quotas.controllers import quota_router
from app.domain.refusals import DOMAIN_ERRORS
from app.engine import Engine
from app.settings import Settings
from app.web import pages
from app.web.client_input import HTTP_CLIENT_CLOSED_REQUEST, SafeRequest
from app.web.dependencies import app_dependencies
from app.web.errors import EXCEPTION_HANDLERS, all_subclasses
from app.web.metrics import metrics_endpoint
from app.web.proxy_peer import ProxyPeer
from app.web.security import security_headers_hook
from app.web.services import Services
from app.web.session_store import (
    STORE_ERRORS,
    STORE_EXCEPTION_HANDLERS,
    redis_client,
    session_store,
)
from app.web.sessions import RotatingSessionConfig
from app.web.turns import UserWriteTurns

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SESSION_MAX_AGE_S = int(SESSION_MAX_AGE.total_seconds())
PROBES = ["^/healthz$", "^/readyz$"]  # liveness and readiness: no session, no user


def attempt_store(settings: Settings) -> AttemptStore:
    """Log-in and sign-up attempts are counted where the sessions live: shared between replicas."""
    if settings.session_store_url:
        client = redis_client(settings.session_store_url)
        return RedisAttemptStore(client, settings.rate_limit_namespace)
    return MemoryAttemptStore()


def auth_limits(settings: Settings) -> AuthLimits:
    return AuthLimits(
        attempt_store(settings),
        login_window_s=settings.login_window_s,
        login_max_per_address=settings.login_max_per_address,
        login_max_per_account=settings.login_max_per_account,
        login_max_per_account_total=settings.login_max_per_account_total,
        signup_window_s=settings.signup_window_s,
        signup_max_per_address=settings.signup_max_per_address,
    )


def trusted_sign_in(settings: Settings) -> list[TrustedHeaderSignIn]:
    """Sign-in by a trusted proxy's header, when AUTH_TRUSTED_EMAIL_HEADER names one."""
    if not settings.auth_trusted_email_header:
        return []
    exclude = ("^/v1/", *PROBES, "^/static/")  # API keys; probes; files
    return [TrustedHeaderSignIn(settings.auth_trusted_email_header, settings.signup_mode, exclude)]


def openapi_config() -> OpenAPIConfig:
    """The OpenAPI document, for admins only, as JSON at /schema (and /schema/openapi.json).

    No documentation site: Litestar's (Redoc, Swagger...) load their JavaScript from a CDN, which
    the Content-Security-Policy forbids. The guard sits on the router Litestar fills with the
    schema handlers (`OpenAPIConfig.openapi_router`, litestar/_openapi/plugin.py); in-process,
    `app.openapi_schema` still builds the whole document.
    """
    return OpenAPIConfig(
        title="streamchat",
        version="0.1.0",
        render_plugins=[JsonRenderPlugin()],
        # As Litestar's own default router (litestar/_openapi/plugin.py), kept out of the document.
        openapi_router=Router(
            "/schema", route_handlers=[], guards=[admin_guard], include_in_schema=False
        ),
    )


def flush_log_queue() -> None:
    """Write out the log records still queued for Litestar's queue listener.

    The listener drains its queue at exit (litestar/logging/standard.py registers `stop` with
    atexit), but after a SIGTERM uvicorn re-raises the signal once it has shut down
    (uvicorn/server.py, `capture_signals`), so atexit never runs and the last lines of a shutdown
    (those that say what could not be saved) would be lost. `stop` drains; `start` resumes.
    """
    for handler in logging.getLogger().handlers:
        listener = getattr(handler, "listener", None)
        if isinstance(listener, QueueListener) and listener._thread is not None:
            listener.stop()
            listener.start()


_frozen = False


def freeze_what_startup_built() -> None:
    """Move every object alive after the first start-up (the app, its routes, the engine, the
    database metadata: they live as long as the process) out of the garbage collector's scans
    (`gc.freeze`). A full collection then walks only what requests create. At GPU rates (a
    thousand streams) that was ~4% more tokens a second and fewer long pauses (bench/README.md).
    Once per process: an app built again (tests) is not frozen, so it can still be collected."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> Litestar:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services = Services.build(settings, engine)
        app.state.services = services
        app.state[SESSIONS_STATE_KEY] = services.sessions  # for auth and guards (no DI there)
        app.state[ACCESS_STATE_KEY] = services.access  # shared with the sign-out check
        app.state[LIVE_SESSIONS_STATE_KEY] = live_sessions = LiveSessions(services.sessions)
        app.state.auth_limits = limits = auth_limits(settings)
        await services.start()
        freeze_what_startup_built()
        try:
            yield
        finally:
            await live_sessions.close()
            await services.stop()
            await limits.store.close()
            flush_log_queue()

    session_config = RotatingSessionConfig(
        max_age=SESSION_MAX_AGE_S,
        samesite="lax",
        httponly=True,
        store="sessions",
        exclude=PROBES,  # alive and ready whatever the session store's state
    )
    csrf_config = CSRFConfig(
        secret=settings.secret_key,
        cookie_name="csrftoken",
        header_name="x-csrftoken",
        cookie_samesite="lax",
        exclude=["/v1"],  # bearer-token API: no cookies, so no CSRF
    )
    return Litestar(
        route_handlers=[
            pages.chat_page,
            pages.login_page,
            pages.signup_page,
            pages.reset_page,
            account_page,
            pages.healthz,
            pages.readyz,
            metrics_endpoint,
            AuthController,
            ApiKeyController,
            AccountApi,
            chat_router,
            user_events,
            settings_router,
            quota_router,
            archive_router,
            AdminApiController,
            AdminPages,
            AdminUsersApi,
            AdminUserPages,
            chat_socket,
            openai_router,
            create_static_files_router(path="/static", directories=[PROJECT_ROOT / "static"]),
        ],
        dependencies=app_dependencies(),
        # domain errors -> HTTP (app/domain/refusals.py); the session store away -> 503
        exception_handlers={**EXCEPTION_HANDLERS, **STORE_EXCEPTION_HANDLERS},
        lifespan=[lifespan],
        request_class=SafeRequest,  # bad JSON bodies are 400s, a client gone mid-body a quiet 499
        middleware=[
            ProxyPeer(settings.forwarded_allow_ips),  # before anything reads the client address
            session_config.middleware,
            *trusted_sign_in(settings),
            # `connection.user`: the session's user; `/v1` authenticates by API key instead
            # (its router's own middleware, app/domain/openai/controllers.py).
            DefineMiddleware(SessionAuthenticationMiddleware, exclude=["^/v1/", *PROBES]),
            UserWriteTurns(),  # one user's burst of writes does not hold up the others
        ],
        csrf_config=csrf_config,
        before_send=[security_headers_hook(settings.cookie_secure)],
        openapi_config=openapi_config(),
        state=State({"metrics_token": settings.metrics_token}),
        stores={"sessions": session_store(settings.session_store_url)},
        template_config=TemplateConfig(
            directory=PROJECT_ROOT / "templates",
            engine=JinjaTemplateEngine,
            engine_callback=pages.register_page_callables,
        ),
        logging_config=LoggingConfig(
            root={"level": "INFO", "handlers": ["queue_listener"]},
            log_exceptions="always",
            disable_stack_trace={400, 401, 403, 404, 405, 409, 413, 422, 429, 503}
            | {HTTP_CLIENT_CLOSED_REQUEST}  # client errors, and clients gone
            | all_subclasses(DOMAIN_ERRORS)  # refusals (Litestar matches the exact class)
            | all_subclasses(STORE_ERRORS),  # the session store away: logged in one line
        ),
        debug=settings.debug,
    )


logging.getLogger("httpx").setLevel(logging.WARNING)
