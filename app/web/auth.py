"""Who is asking: the logged-in user of a cookie session, or the owner of a bearer API key.

Pages and the page API use server-side sessions (the cookie holds only a random session id) plus
CSRF protection on writes; `/v1` uses `Authorization: Bearer <api key>` and no cookies, so it is
exempt from CSRF. A user id lives in the session under USER_KEY.
"""

from __future__ import annotations

from uuid import UUID

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from app.domain.accounts import service as accounts
from app.domain.accounts.models import User
from app.web.services import Services

USER_KEY = "user_id"


def services_of(connection: ASGIConnection) -> Services:
    return connection.app.state.services


async def optional_user(connection: ASGIConnection) -> User | None:
    """The session's user, or None (also when the account was deleted since)."""
    raw = connection.session.get(USER_KEY) if "session" in connection.scope else None
    if not raw:
        return None
    try:
        user_id = UUID(raw)
    except ValueError:
        return None
    return await accounts.get_user(services_of(connection).sessions, user_id)


async def current_user(request: Request) -> User:
    """Dependency for the page API: 401 without a logged-in user."""
    user = await optional_user(request)
    if user is None:
        raise NotAuthorizedException("log in first")
    return user


def login(request: Request, user: User) -> None:
    # A new session id on login: a session fixed before login cannot be hijacked after it.
    request.clear_session()
    request.set_session({USER_KEY: str(user.id)})


def logout(request: Request) -> None:
    request.clear_session()


async def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    user = await optional_user(connection)
    if user is None:
        raise NotAuthorizedException("log in first")
    if not user.is_admin:
        raise PermissionDeniedException("admins only")


async def api_key_user(request: Request) -> User:
    """Dependency for `/v1`: the owner of the bearer API key."""
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise NotAuthorizedException("missing bearer API key (Authorization: Bearer sk-...)")
    user = await accounts.verify_api_key(services_of(request).sessions, secret.strip())
    if user is None:
        raise NotAuthorizedException("invalid or revoked API key")
    return user
