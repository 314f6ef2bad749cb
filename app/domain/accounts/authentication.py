"""Who is asking: Litestar's authentication middleware sets `connection.user` to the asking user's
id, and `connection.auth` to how they proved it ("session", "api_key"), before any guard or
handler runs.

- Pages, the page API and the WebSocket: the user id the server-side session holds (log-in puts it
  there, app/domain/accounts/login.py), or None for an anonymous client. Nothing is refused here:
  public routes serve anyone, and guards (app/domain/accounts/guards.py) refuse the rest. The
  account must still allow the session (app/domain/accounts/access.py): a disabled or deleted
  account's session, or one from before "log out everywhere", is dropped; a pending account's
  is kept, with `connection.user` None and `connection.auth` "pending" (the waiting page).
- `/v1`: the owner of the bearer API key, or a 401 (OpenAI's shape, from the router's exception
  handlers: Litestar answers an error raised in a route's middleware with the route's handlers,
  `ScopeState.exception_handlers` set in litestar/_asgi/asgi_router.py).

Only the id, never the user's row: the state and epoch come from a short-lived cache (at most one
read per user and second); the routes that read the row load it (accounts/dependencies.py).
The middleware class is Litestar's (litestar/middleware/authentication.py); its `__call__` puts
`AuthenticationResult.user`/`.auth` in the scope.
"""

from __future__ import annotations

from uuid import UUID

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.middleware.authentication import (
    AbstractAuthenticationMiddleware,
    AuthenticationResult,
)
from litestar.types import ASGIApp

from app.db.session import Sessions
from app.domain.accounts import service as accounts
from app.domain.accounts.access import AccessCache
from app.domain.accounts.browser_sessions import LiveSessions
from app.domain.accounts.login import EPOCH_KEY, USER_KEY, session_row
from app.domain.accounts.models import UserState

SESSIONS_STATE_KEY = "sessions"
"""Where the app keeps its session factory in `app.state`: middleware and guards get no dependency
injection (litestar/handlers/base.py, `authorize_connection` calls each guard with the connection
and the handler only), so they read it from there."""
ACCESS_STATE_KEY = "access"
"""Where the app keeps its `AccessCache` in `app.state`."""
LIVE_SESSIONS_STATE_KEY = "live_sessions"
"""Where the app keeps its `LiveSessions` (which listed sessions were ended) in `app.state`."""
PENDING = "pending"
"""`connection.auth` of a session whose account waits for an admin's approval."""


def _session_user_id(connection: ASGIConnection) -> UUID | None:
    raw = connection.session.get(USER_KEY)
    if not raw:
        return None
    try:
        return UUID(raw)
    except ValueError:
        return None


class SessionAuthenticationMiddleware(AbstractAuthenticationMiddleware):
    """`connection.user`: the session's user id, or None. Runs inside the session middleware, for
    every method (OPTIONS included, so that a guard always finds `connection.user` set)."""

    def __init__(self, app: ASGIApp, exclude: str | list[str] | None = None) -> None:
        super().__init__(app, exclude=exclude, exclude_http_methods=[])

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        user_id = _session_user_id(connection)
        if user_id is None:
            return AuthenticationResult(user=None, auth=None)
        cache: AccessCache = connection.app.state[ACCESS_STATE_KEY]
        access = await cache.get(user_id)
        epoch = connection.session.get(EPOCH_KEY, 0)
        if access is not None and access.epoch < epoch:
            # The epoch was raised a moment ago, keeping this session (its own password change,
            # here or on another replica): the cached row is older than the session.
            cache.forget(user_id)
            access = await cache.get(user_id)
        if access is None or access.state == UserState.DISABLED or access.epoch != epoch:
            connection.clear_session()  # the session store forgets it (app/web/sessions.py)
            return AuthenticationResult(user=None, auth=None)
        listed = session_row(connection)
        if listed is not None:
            live: LiveSessions = connection.app.state[LIVE_SESSIONS_STATE_KEY]
            if not await live.alive(listed):  # ended from the account page
                connection.clear_session()
                return AuthenticationResult(user=None, auth=None)
        if access.state == UserState.PENDING:
            return AuthenticationResult(user=None, auth=PENDING)
        return AuthenticationResult(user=user_id, auth="session")


class ApiKeyAuthenticationMiddleware(AbstractAuthenticationMiddleware):
    """`connection.user`: the id of the bearer API key's owner; 401 without a valid key. OPTIONS
    is let through unauthenticated (Litestar's default)."""

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        scheme, _, secret = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise NotAuthorizedException("missing bearer API key (Authorization: Bearer sk-...)")
        sessions: Sessions = connection.app.state[SESSIONS_STATE_KEY]
        owner = await accounts.verify_api_key(sessions, secret.strip())
        if owner is None:
            raise NotAuthorizedException("invalid or revoked API key")
        return AuthenticationResult(user=owner.id, auth="api_key")
