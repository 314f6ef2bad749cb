"""Security headers on every response, and `Secure` on every cookie when the site is on https.

One `before_send` hook (Litestar calls it for every message the app sends, error pages and static
files included: `Litestar._wrap_send` in litestar/app.py), so no response can miss the headers.

The Content-Security-Policy allows only this site's own files: scripts are ES modules from
/static (no inline script or event handler anywhere), styles come from /static/css (the page
sets sizes through CSSOM, `el.style.x = ...`, which CSP does not restrict), fetch, EventSource
and the WebSocket go to this origin, and no other site may frame the pages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from litestar.datastructures import MutableScopeHeaders
from litestar.types import Message, Scope

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # data: for the empty favicon (templates/base.html)
        "connect-src 'self'",  # includes ws(s):// to this host (CSP level 3)
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",  # frame-ancestors for browsers that predate it
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}

COOKIE_SECURE_CHOICES = ("auto", "true", "false")


def cookies_secure_for(setting: str) -> Callable[[Scope], bool]:
    """Whether this request's cookies get `Secure`: "true", "false", or "auto" = when the request
    came over https (uvicorn's proxy headers take the scheme from a trusted proxy's
    X-Forwarded-Proto, so behind nginx with TLS the scope says https)."""
    if setting not in COOKIE_SECURE_CHOICES:
        raise ValueError(f"COOKIE_SECURE must be one of {COOKIE_SECURE_CHOICES}, not {setting!r}")
    if setting == "auto":
        return lambda scope: scope.get("scheme") in ("https", "wss")
    always = setting == "true"
    return lambda scope: always


def _with_secure(cookie: str) -> str:
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    return cookie if "secure" in attributes else f"{cookie}; Secure"


def security_headers_hook(cookie_secure: str) -> Callable[[Message, Scope], Awaitable[None]]:
    secure = cookies_secure_for(cookie_secure)

    async def before_send(message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start":
            return
        headers = MutableScopeHeaders.from_message(message)
        for name, value in SECURITY_HEADERS.items():
            if name not in headers:
                headers[name] = value
        if secure(scope):
            cookies = headers.getall("set-cookie", [])
            if cookies:
                del headers["set-cookie"]
                for cookie in cookies:
                    headers.add("set-cookie", _with_secure(cookie))

    return before_send
