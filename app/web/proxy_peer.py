"""Which proxies are trusted, decided on the connection's own peer, then X-Forwarded-* applied.

uvicorn can apply `X-Forwarded-For`/`-Proto` itself (its `--proxy-headers`, on by default), but it
then replaces the client address in the scope, and nothing downstream can tell whether the
connection came from a trusted proxy or from a client that wrote that header itself. The trusted
sign-in header (app/domain/accounts/trusted_header.py) must know. So the Procfile runs uvicorn with
`--no-proxy-headers` and the app does the same work here, with uvicorn's own middleware and the
same `FORWARDED_ALLOW_IPS`, after noting in the scope (`PEER_TRUSTED`) whether the peer itself
is a trusted proxy.

Under a uvicorn that still applies the headers itself, the peer seen here is the forwarded client,
so a proxied request counts as untrusted: the trusted header is refused (fail closed), and the
client address stays right, as the second application changes nothing.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.domain.accounts.trusted_header import PEER_TRUSTED


class ProxyPeer:
    """The first middleware of every route (Litestar calls it with each route's app once, at
    start): PEER_TRUSTED, then the forwarded client and scheme."""

    def __init__(self, trusted: tuple[str, ...]) -> None:
        self.trusted = list(trusted)

    def __call__(self, app: ASGIApp) -> ASGIApp:
        forwarded = ProxyHeadersMiddleware(app, trusted_hosts=self.trusted)  # type: ignore[arg-type]

        async def proxy_peer(scope: Scope, receive: Receive, send: Send) -> None:
            client = scope.get("client")
            trusted = bool(client) and client[0] in forwarded.trusted_hosts  # type: ignore[index]
            scope[PEER_TRUSTED] = trusted  # type: ignore[literal-required]
            await forwarded(scope, receive, send)  # type: ignore[arg-type]

        return proxy_peer
