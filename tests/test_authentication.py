"""The session's authentication middleware (app/domain/accounts/authentication.py) and the
`logged_in` guard, over Litestar's own test client and the app's rotating sessions: the middleware
puts the session's user id in `connection.user` (None when anonymous, never a refusal), and the
guard refuses an anonymous client with 401 while letting Litestar's generated OPTIONS through."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

from litestar import Request, Router, get, post
from litestar.middleware import DefineMiddleware
from litestar.params import FromPath
from litestar.stores.memory import MemoryStore
from litestar.testing import TestClient, create_test_client

from app.domain.accounts.authentication import SessionAuthenticationMiddleware
from app.domain.accounts.guards import logged_in
from app.domain.accounts.login import USER_KEY
from app.web.sessions import RotatingSessionConfig

ALICE = uuid4()


@post("/login/{raw:str}")
async def login(request: Request[Any, Any, Any], raw: FromPath[str]) -> None:
    request.set_session({USER_KEY: raw})


@get("/who")
async def who(request: Request[UUID | None, Any, Any]) -> dict[str, Any]:
    return {"user": request.user and str(request.user), "auth": request.auth}


@get("/")
async def private(request: Request[UUID, Any, Any]) -> str:
    return str(request.user)


# On a router, as the app's page API has it: Litestar's generated OPTIONS handler gets the
# router's guards too (litestar/routes/http.py gives it the route's owner).
private_router = Router("/private", route_handlers=[private], guards=[logged_in])


def client() -> TestClient[Any]:
    sessions = RotatingSessionConfig(max_age=1000, store="sessions")
    return create_test_client(
        [login, who, private_router],
        middleware=[sessions.middleware, DefineMiddleware(SessionAuthenticationMiddleware)],
        stores={"sessions": MemoryStore()},
    )


def test_anonymous_clients_pass_as_none_and_the_guard_refuses_them() -> None:
    with client() as anonymous:
        assert anonymous.get("/who").json() == {"user": None, "auth": None}
        refused = anonymous.get("/private")
        assert refused.status_code == 401
        assert refused.json() == {"status_code": 401, "detail": "log in first"}
        assert anonymous.options("/private").status_code == 204


def test_the_sessions_user_id_is_the_connections_user() -> None:
    with client() as alice:
        alice.post(f"/login/{ALICE}")
        assert alice.get("/who").json() == {"user": str(ALICE), "auth": "session"}
        assert alice.get("/private").text == str(ALICE)


def test_a_session_without_a_valid_user_id_is_anonymous() -> None:
    with client() as odd:
        odd.post("/login/not-a-uuid")
        assert odd.get("/who").json() == {"user": None, "auth": None}
        assert odd.get("/private").status_code == 401
