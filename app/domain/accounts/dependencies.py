"""Who is asking, as dependencies the web layer provides (`Provide`): the logged-in user of a
cookie session, or the owner of a bearer API key.

Pages and the page API use server-side sessions (the cookie holds only a random session id) plus
CSRF protection on writes; `/v1` uses `Authorization: Bearer <api key>` and no cookies, so it is
exempt from CSRF. Each function takes the app's session factory (`sessions`, itself a dependency).
"""

from __future__ import annotations

from uuid import UUID

from litestar import Request, WebSocket
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException

from app.db.session import Sessions
from app.domain.accounts import service as accounts
from app.domain.accounts.login import USER_KEY
from app.domain.accounts.models import User


def _session_user_id(connection: ASGIConnection) -> UUID | None:
    raw = connection.session.get(USER_KEY) if "session" in connection.scope else None
    if not raw:
        return None
    try:
        return UUID(raw)
    except ValueError:
        return None


async def session_user(connection: ASGIConnection, sessions: Sessions) -> User | None:
    """The session's user, or None (also when the account was deleted since)."""
    user_id = _session_user_id(connection)
    return None if user_id is None else await accounts.get_user(sessions, user_id)


async def optional_user(request: Request, sessions: Sessions) -> User | None:
    """Dependency for pages: the logged-in user, or None."""
    return await session_user(request, sessions)


async def socket_user(socket: WebSocket, sessions: Sessions) -> User | None:
    """Dependency for the WebSocket: the logged-in user, or None (the handler closes the socket)."""
    return await session_user(socket, sessions)


async def current_user(request: Request, sessions: Sessions) -> User:
    """Dependency for the page API: 401 without a logged-in user."""
    user = await session_user(request, sessions)
    if user is None:
        raise NotAuthorizedException("log in first")
    return user


def session_user_id(request: Request) -> UUID:
    """Dependency for a route whose own query checks that the user still exists (and answers
    NotLoggedInError, a 401, if not): the session's user id, without reading the user's row
    (a round trip fewer per request); 401 without a logged-in session."""
    user_id = _session_user_id(request)
    if user_id is None:
        raise NotAuthorizedException("log in first")
    return user_id


async def api_key_user(request: Request, sessions: Sessions) -> User:
    """Dependency for `/v1`: the owner of the bearer API key."""
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise NotAuthorizedException("missing bearer API key (Authorization: Bearer sk-...)")
    user = await accounts.verify_api_key(sessions, secret.strip())
    if user is None:
        raise NotAuthorizedException("invalid or revoked API key")
    return user
