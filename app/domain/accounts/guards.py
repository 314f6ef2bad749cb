"""Route guards over `connection.user` (set by the authentication middleware,
app/domain/accounts/authentication.py): the page API needs a logged-in user; admin pages and the
admin API a logged-in admin."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar.connection import ASGIConnection
from litestar.enums import HttpMethod
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from app.db.session import Sessions
from app.domain.accounts.authentication import SESSIONS_STATE_KEY
from app.domain.accounts.dependencies import logged_in_user
from app.domain.accounts.models import UserState


async def logged_in(
    connection: ASGIConnection[Any, UUID | None, Any, Any], _: BaseRouteHandler
) -> None:
    """A session with a user; no database round trip (the routes' own reads check the rest).

    OPTIONS passes: Litestar's generated handler for it (litestar/routes/http.py) answers only
    the allowed methods, and Litestar's authentication middleware exempts it by default too."""
    if connection.user is None and connection.scope.get("method") != HttpMethod.OPTIONS:
        raise NotAuthorizedException("log in first")


async def admin_guard(
    connection: ASGIConnection[Any, UUID | None, Any, Any], _: BaseRouteHandler
) -> None:
    """Admin rights are read from the user's row on every request, never kept in the session."""
    sessions: Sessions = connection.app.state[SESSIONS_STATE_KEY]
    user = await logged_in_user(connection, sessions)
    if user is None:
        raise NotAuthorizedException("log in first")
    if not user.is_admin or user.state != UserState.ACTIVE:
        raise PermissionDeniedException("admins only")
