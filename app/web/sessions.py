"""Server-side sessions whose ids only the server makes, and which change at every log-in.

Litestar's `ServerSideSessionBackend` (litestar/middleware/session/server_side.py) adopts whatever
id the client's cookie carries: `get_session_id` returns the cookie's value when there is one, and
`store_in_message` saves the session under it, even after `clear_session()`. A cookie planted
before log-in (session fixation) would then name the victim's logged-in session. Here:

- an id is used only if the store already holds a session under it (one this server made);
  any other id from a client is ignored, never stored under;
- `rotate()` (called at log-in and sign-up) drops the old session and saves the data under a
  fresh random id, so an id known before log-in is worth nothing after it;
- an empty session is not stored at all, so anonymous requests leave nothing in the store and
  get no session cookie;
- a session that a request left as it found it is not written again (Litestar writes it, and
  sets its cookie, on every response), unless a tenth of its lifetime has passed since it was last
  written: each write stamps it (`RENEWED`), and that write is what keeps an active user's
  session and cookie from expiring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie, MutableScopeHeaders
from litestar.middleware.session.server_side import (
    ServerSideSessionBackend,
    ServerSideSessionConfig,
)
from litestar.types import Empty, Message, ScopeSession
from litestar.utils.dataclass import extract_dataclass_items

from app.domain.accounts.login import ROTATE  # set by `rotate()` at log-in

LOADED_ID = "streamchat.session_loaded_id"  # scope key: the id the session was loaded under
LOADED_DATA = "streamchat.session_loaded_data"  # scope key: the session as it was loaded
RENEWED = "_renewed"  # in the session: when it was last written (Unix seconds)
RENEW_FRACTION = 10  # an unchanged session is written again after max_age / this


def _content(session: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in session.items() if k != RENEWED}


class RotatingSessionBackend(ServerSideSessionBackend):
    async def load_from_connection(self, connection: ASGIConnection) -> dict[str, Any]:
        session_id = connection.cookies.get(self.config.key)
        if session_id:
            store = self.config.get_store_from_app(connection.scope["app"])
            data = await self.get(session_id, store=store)
            if data is not None:
                connection.scope[LOADED_ID] = session_id  # type: ignore[literal-required]
                session = self.deserialize_data(data)
                connection.scope[LOADED_DATA] = dict(session)  # type: ignore[literal-required]
                return session
        return {}

    def get_session_id(self, connection: ASGIConnection) -> str:
        """The id of a session this server made and still holds, else a fresh one (never the
        client's unknown id)."""
        return connection.scope.get(LOADED_ID) or self.generate_session_id()  # type: ignore[return-value]

    async def store_in_message(
        self, scope_session: ScopeSession, message: Message, connection: ASGIConnection
    ) -> None:
        scope = connection.scope
        store = self.config.get_store_from_app(scope["app"])
        headers = MutableScopeHeaders.from_message(message)
        loaded_id: str | None = scope.get(LOADED_ID)  # type: ignore[assignment]
        cookie_params = dict(
            extract_dataclass_items(self.config, exclude_none=True, include=Cookie.__dict__.keys())
        )
        content = {} if scope_session is Empty else _content(dict(scope_session))
        if not content:
            if loaded_id is not None:  # logged out (or emptied): forget it, expire the cookie
                await self.delete(loaded_id, store=store)
                headers.add(
                    "Set-Cookie",
                    Cookie(value="null", key=self.config.key, expires=0, **cookie_params).to_header(
                        header=""
                    ),
                )
            return
        # `clear_session()` also empties the connection's id (litestar/connection/base.py).
        session_id = connection.get_session_id() or loaded_id
        if scope.get(ROTATE) or session_id is None:
            session_id = self.generate_session_id()
        now = time.time()
        if session_id == loaded_id and self._unchanged_and_fresh(scope, content, now):
            return  # the store and the browser already hold it
        if loaded_id is not None and loaded_id != session_id:
            await self.delete(loaded_id, store=store)
        data = {**content, RENEWED: int(now)}
        await self.set(session_id, self.serialize_data(data, scope), store=store)
        headers.add(
            "Set-Cookie",
            Cookie(value=session_id, key=self.config.key, **cookie_params).to_header(header=""),
        )

    def _unchanged_and_fresh(self, scope: Any, content: dict[str, Any], now: float) -> bool:
        loaded: dict[str, Any] | None = scope.get(LOADED_DATA)
        if loaded is None or content != _content(loaded):
            return False
        renewed = loaded.get(RENEWED)
        max_age = self.config.max_age
        return isinstance(renewed, int | float) and now - renewed < max_age / RENEW_FRACTION


@dataclass
class RotatingSessionConfig(ServerSideSessionConfig):
    _backend_class = RotatingSessionBackend  # type: ignore[assignment]
