"""Sign-in by a trusted proxy's header (`AUTH_TRUSTED_EMAIL_HEADER`), behind a company's log-in.

Behind oauth2-proxy, Authelia or another single sign-on in front of nginx, the proxy has already
checked who the user is and names them in a header (`X-Auth-Request-Email`, `Remote-Email`...).
With the setting on, a request carrying that header is signed in as that email's account:

- only when it comes straight from a trusted proxy: the connection's own peer address is in
  `FORWARDED_ALLOW_IPS` (the web layer records it before any `X-Forwarded-For` is applied:
  app/web/proxy_peer.py, scope key `PEER_TRUSTED`). From any other address the header is
  ignored (and logged): a client that reaches a replica directly cannot name itself anyone;
- the account is found by its email, or made as SIGNUP_MODE says (open: active; approval:
  pending, so the waiting page; invite and closed: none, a 403 that says to ask an admin). The
  first account of an empty instance is its admin, as with a sign-up. A disabled account is
  refused (403);
- the session then holds the user as after a password log-in (rotated id, the account's epoch),
  plus the email the header gave, so that later requests with the same header cost no database
  read, and a different email in the header (another person behind the same browser) signs the
  new one in instead.

The proxy must set the header on every request and drop whatever a client sent under that name
(nginx's `proxy_set_header` replaces it); the app cannot tell a forwarded client header from the
proxy's own.
"""

from __future__ import annotations

import logging
import secrets
import time

from litestar.connection import ASGIConnection
from litestar.exceptions import PermissionDeniedException
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from app.db.session import Sessions
from app.domain.accounts import service as accounts
from app.domain.accounts.authentication import SESSIONS_STATE_KEY
from app.domain.accounts.login import USER_KEY, log_in
from app.domain.accounts.models import User, UserState

log = logging.getLogger(__name__)

PEER_TRUSTED = "streamchat.peer_trusted"
"""Scope key: whether the connection's own peer (before X-Forwarded-For) is a trusted proxy."""
TRUSTED_EMAIL_KEY = "trusted_email"  # in the session: the header's email it was signed in by
WARN_EVERY_S = 60.0  # an untrusted sender of the header is logged at most this often


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1").strip()
    return None


class TrustedHeaderSignIn(ASGIMiddleware):
    """Runs inside the session middleware, before the session's user is read. An instance goes
    in the app's `middleware` list (Litestar calls it with each route's app)."""

    def __init__(self, header: str, signup_mode: str, exclude: tuple[str, ...] = ()) -> None:
        self.header = header.strip().lower().encode("latin-1")
        self.signup_mode = signup_mode
        self.exclude_path_pattern = exclude or None
        self._warned_at = 0.0

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        email = _header(scope, self.header)
        if email:
            if not scope.get(PEER_TRUSTED):
                self._warn_untrusted(scope)
            else:
                await self._sign_in(ASGIConnection(scope), email)
        await next_app(scope, receive, send)

    def _warn_untrusted(self, scope: Scope) -> None:
        now = time.monotonic()
        if now - self._warned_at > WARN_EVERY_S:
            self._warned_at = now
            client = scope.get("client")
            log.warning(
                "ignored %s from %s: not a proxy in FORWARDED_ALLOW_IPS",
                self.header.decode(),
                client[0] if client else "an unknown address",
            )

    async def _sign_in(self, connection: ASGIConnection, email: str) -> None:
        """Sign the connection in as `email`, or raise the 403 that says why not (answered by
        the route's exception handlers, as the API-key middleware's 401)."""
        email = accounts.normalize_email(email)
        session = connection.scope.get("session") or {}
        if session.get(TRUSTED_EMAIL_KEY) == email and session.get(USER_KEY):
            return  # signed in by this header before; the session's checks still apply
        sessions: Sessions = connection.app.state[SESSIONS_STATE_KEY]
        user = await accounts.get_user_by_email(sessions, email)
        if user is None:
            user = await self._new_account(sessions, email)
            if user is None:
                raise PermissionDeniedException(
                    f"there is no account for {email} here: ask an admin"
                )
        if user.state == UserState.DISABLED:
            raise PermissionDeniedException("this account is disabled")
        # Listed among the user's sessions like any log-in (app/domain/accounts/login.py)
        await log_in(connection, sessions, user)  # type: ignore[arg-type]  # headers and session only
        connection.scope["session"][TRUSTED_EMAIL_KEY] = email  # type: ignore[index]
        log.info("signed in %s by the trusted header", email)

    async def _new_account(self, sessions: Sessions, email: str) -> User | None:
        """As a sign-up in this SIGNUP_MODE would make it, with a password nobody knows (an admin's
        reset link gives one, for the day the proxy goes); None when the mode makes none."""
        password = secrets.token_urlsafe(32)
        try:
            if self.signup_mode in ("invite", "closed"):
                return await accounts.create_user(sessions, email, password, only_first=True)
            state = UserState.PENDING if self.signup_mode == "approval" else UserState.ACTIVE
            return await accounts.create_user(sessions, email, password, state=state)
        except accounts.SignupClosedError:
            return None
        except accounts.EmailTakenError:  # made by a request racing this one
            return await accounts.get_user_by_email(sessions, email)
