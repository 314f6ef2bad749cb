"""Route guards: admin pages and the admin API need a logged-in admin."""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from app.db.session import Sessions
from app.domain.accounts.dependencies import session_user

SESSIONS_STATE_KEY = "sessions"
"""Where the app keeps its session factory in `app.state`: guards get no dependency injection
(litestar/handlers/base.py, `authorize_connection` calls each guard with the connection and the
handler only), so they read it from there."""


async def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    sessions: Sessions = connection.app.state[SESSIONS_STATE_KEY]
    user = await session_user(connection, sessions)
    if user is None:
        raise NotAuthorizedException("log in first")
    if not user.is_admin:
        raise PermissionDeniedException("admins only")
