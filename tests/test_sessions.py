"""Server-side sessions (app/web/sessions.py) over Litestar's own test client and memory store:
a request that leaves the session as it found it writes nothing and sets no cookie, until a tenth
of the session's lifetime has passed since the last write; a change is written at once. And the
store used without Redis, which never makes a request wait for another."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest
from litestar import Request, get, post
from litestar.stores.memory import MemoryStore
from litestar.testing import create_test_client

from app.domain.accounts.login import rotate
from app.web import sessions
from app.web.session_store import LocalStore, session_store
from app.web.sessions import RotatingSessionConfig

MAX_AGE = 1000


@post("/login")
async def login(request: Request[Any, Any, Any]) -> None:
    request.clear_session()
    request.set_session({"user": "alice"})
    rotate(request)


@get("/me")
async def me(request: Request[Any, Any, Any]) -> str:
    return str(request.session.get("user"))


@post("/theme")
async def theme(request: Request[Any, Any, Any]) -> None:
    request.session["theme"] = "dark"


def session_cookie(response: Any) -> list[str]:
    return [c for c in response.headers.get_list("set-cookie") if c.startswith("session=")]


def test_an_unchanged_session_is_written_again_only_when_a_tenth_of_its_life_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(sessions.time, "time", lambda: now[0])
    writes: list[str] = []

    class CountingStore(MemoryStore):
        async def set(self, key: str, value: Any, expires_in: Any = None) -> None:
            writes.append(key)
            await super().set(key, value, expires_in)

    store = CountingStore()
    config = RotatingSessionConfig(max_age=MAX_AGE, store="sessions")
    with create_test_client(
        [login, me, theme], middleware=[config.middleware], stores={"sessions": store}
    ) as client:
        assert session_cookie(client.post("/login"))
        assert len(writes) == 1
        for _ in range(3):
            now[0] += MAX_AGE / 40
            response = client.get("/me")
            assert response.text == "alice"
            assert session_cookie(response) == []  # nothing changed: no write, no cookie
        assert len(writes) == 1
        now[0] += MAX_AGE / 10  # a tenth of its life since the last write: renewed
        response = client.get("/me")
        assert response.text == "alice" and session_cookie(response)
        assert len(writes) == 2
        assert session_cookie(client.get("/me")) == [] and len(writes) == 2
        assert session_cookie(client.post("/theme"))  # a change is written at once
        assert len(writes) == 3


async def test_the_memory_store_never_waits_for_its_own_lock() -> None:
    """The session store without Redis (app/web/session_store.py, LocalStore): what Litestar's
    MemoryStore does (expiry, renewal, delete), with no operation giving up the event loop:
    MemoryStore's lock let a burst of requests load their sessions one per loop turn."""
    store = session_store(None)
    assert isinstance(store, LocalStore)

    def at_once(coroutine: Coroutine[Any, Any, Any]) -> Any:
        """The coroutine's result, run to its end without one suspension (or AssertionError)."""
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise AssertionError("it waited")

    at_once(store.set("a", "one", expires_in=100))
    at_once(store.set("b", b"two", expires_in=-1))  # expired at once
    assert at_once(store.get("a", renew_for=500)) == b"one"
    assert 400 < at_once(store.expires_in("a")) <= 500  # renewed
    assert at_once(store.get("b")) is None
    assert not at_once(store.exists("b"))  # an expired entry goes when read
    at_once(store.delete("a"))
    assert at_once(store.get("a")) is None
    with pytest.raises(AssertionError, match="waited"):  # the check itself can fail
        at_once(MemoryStore().get("a"))
