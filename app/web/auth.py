"""Who is asking: the logged-in user of a cookie session, or the owner of a bearer API key.

Pages and the page API use server-side sessions (the cookie holds only a random session id) plus
CSRF protection on writes; `/v1` uses `Authorization: Bearer <api key>` and no cookies, so it is
exempt from CSRF. A user id lives in the session under USER_KEY.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from uuid import UUID

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from app.domain.accounts import service as accounts
from app.domain.accounts.models import User
from app.web.services import Services
from app.web.sessions import rotate

USER_KEY = "user_id"
DEVICE_COOKIE = "device"
DEVICE_MAX_AGE_S = 365 * 24 * 3600


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
    """Log in (also after sign-up): the session starts afresh under a new server-made id, and
    the old id is dropped, so an id fixed before log-in names nothing after it (app/web/sessions.py).
    Admin rights are read from the database on every request, never kept in the session."""
    request.clear_session()
    request.set_session({USER_KEY: str(user.id)})
    rotate(request)


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


def client_address(request: Request) -> str:
    """The client's address. Behind nginx, uvicorn's proxy headers put the real client here from
    X-Forwarded-For, trusting only FORWARDED_ALLOW_IPS (127.0.0.1 unless set)."""
    return request.client.host if request.client else "unknown"


# -- device cookies: "this browser has logged in to this account before" -------------------------
# The log-in limits (app/domain/accounts/ratelimit.py) count such a browser on its own, so that
# failures from elsewhere never lock the owner's browser out. The cookie is a random id signed with
# SECRET_KEY for one account; it grants nothing by itself (the password is still checked).


def _device_signature(request: Request, device_id: str, email: str) -> str:
    key = services_of(request).settings.secret_key.encode()
    return hmac.new(key, f"device|{device_id}|{email}".encode(), hashlib.sha256).hexdigest()[:32]


def known_device(request: Request, email: str) -> str | None:
    """The id of this browser's device cookie if it was issued for `email`, else None."""
    device_id, _, signature = request.cookies.get(DEVICE_COOKIE, "").partition(".")
    if not device_id or not signature:
        return None
    expected = _device_signature(request, device_id, email)
    return device_id if hmac.compare_digest(signature, expected) else None


def device_cookie(request: Request, email: str) -> Cookie:
    """The device cookie to (re)issue after a successful log-in or sign-up as `email`."""
    device_id = known_device(request, email) or secrets.token_urlsafe(16)
    return Cookie(
        key=DEVICE_COOKIE,
        value=f"{device_id}.{_device_signature(request, device_id, email)}",
        max_age=DEVICE_MAX_AGE_S,
        path="/api/auth",
        httponly=True,
        samesite="strict",
    )
