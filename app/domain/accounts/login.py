"""Logging a browser in and out, and device cookies ("this browser has logged in here before").

A user id lives in the session under USER_KEY, and the id of the session's row (the list of the
user's sessions, app/domain/accounts/browser_sessions.py) under SID_KEY. Log-in rotates the session
id (the session backend, app/web/sessions.py, reads the ROTATE scope key on the way out).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from uuid import UUID

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie

from app.db.session import Sessions
from app.domain.accounts import browser_sessions
from app.domain.accounts.models import User

USER_KEY = "user_id"
EPOCH_KEY = "epoch"  # the account's session_epoch at log-in: a raised one ends this session
SID_KEY = "sid"  # the session's row in account_sessions: a deleted row ends this session
DEVICE_COOKIE = "device"
DEVICE_MAX_AGE_S = 365 * 24 * 3600
ROTATE = "streamchat.session_rotate"  # scope key: give the session a fresh id on the way out


def rotate(connection: ASGIConnection) -> None:
    """Save this request's session under a fresh server-made id and drop the old one."""
    connection.scope[ROTATE] = True  # type: ignore[literal-required]


def login(request: Request, user: User, session_id: UUID | None = None) -> None:
    """Log in (also after sign-up): the session starts afresh under a new server-made id, and
    the old id is dropped, so an id fixed before log-in names nothing after it (app/web/sessions.py).
    Admin rights are read from the database on every request, never kept in the session.
    `session_id`: the session's row (`log_in` makes it); without one the session is not listed."""
    request.clear_session()
    data: dict[str, object] = {USER_KEY: str(user.id), EPOCH_KEY: user.session_epoch}
    if session_id is not None:
        data[SID_KEY] = str(session_id)
    request.set_session(data)
    rotate(request)


async def log_in(request: Request, sessions: Sessions, user: User) -> None:
    """`login`, with a row in the list of the user's sessions (browser, address, last seen)."""
    await end_listed(request, sessions)
    user_agent = request.headers.get("user-agent", "")
    row = await browser_sessions.start(sessions, user, user_agent, client_address(request))
    login(request, user, row)


def session_row(connection: ASGIConnection) -> UUID | None:
    """The id of this session's row, or None (a session from before the list, or none)."""
    raw = connection.session.get(SID_KEY) if connection.scope.get("session") else None
    try:
        return UUID(raw) if raw else None
    except ValueError:
        return None


async def end_listed(request: Request, sessions: Sessions) -> None:
    """Delete this session's row, if it has one (it is ending or being replaced)."""
    current = session_row(request)
    user_id = request.session.get(USER_KEY) if request.scope.get("session") else None
    if current is not None and user_id:
        await browser_sessions.end(sessions, UUID(user_id), current)


def logout(request: Request) -> None:
    request.clear_session()


def client_address(request: ASGIConnection) -> str:
    """The client's address. Behind nginx, uvicorn's proxy headers put the real client here from
    X-Forwarded-For, trusting only FORWARDED_ALLOW_IPS (127.0.0.1 unless set)."""
    return request.client.host if request.client else "unknown"


# -- device cookies: "this browser has logged in to this account before" -------------------------
# The log-in limits (app/domain/accounts/ratelimit.py) count such a browser on its own, so that
# failures from elsewhere never lock the owner's browser out. The cookie is a random id signed with
# SECRET_KEY for one account; it grants nothing by itself (the password is still checked).


def _device_signature(secret_key: str, device_id: str, email: str) -> str:
    key = secret_key.encode()
    return hmac.new(key, f"device|{device_id}|{email}".encode(), hashlib.sha256).hexdigest()[:32]


def known_device(request: Request, secret_key: str, email: str) -> str | None:
    """The id of this browser's device cookie if it was issued for `email`, else None."""
    device_id, _, signature = request.cookies.get(DEVICE_COOKIE, "").partition(".")
    if not device_id or not signature:
        return None
    expected = _device_signature(secret_key, device_id, email)
    return device_id if hmac.compare_digest(signature, expected) else None


def device_cookie(request: Request, secret_key: str, email: str) -> Cookie:
    """The device cookie to (re)issue after a successful log-in or sign-up as `email`."""
    device_id = known_device(request, secret_key, email) or secrets.token_urlsafe(16)
    return Cookie(
        key=DEVICE_COOKIE,
        value=f"{device_id}.{_device_signature(secret_key, device_id, email)}",
        max_age=DEVICE_MAX_AGE_S,
        path="/api/auth",
        httponly=True,
        samesite="strict",
    )
