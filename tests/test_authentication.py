"""The session's authentication middleware (app/domain/accounts/authentication.py) and the
`logged_in` guard, over Litestar's own test client, the app's rotating sessions and a real SQLite
database (the account's state and session epoch): the middleware puts the session's user id in
`connection.user` (None when anonymous, never a refusal), and the guard refuses an anonymous client
with 401 while letting Litestar's generated OPTIONS through. A disabled account's session, and one
from before its epoch was raised, are dropped; a pending account's is kept, as "pending"."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Request, Router, get, post
from litestar.middleware import DefineMiddleware
from litestar.params import FromPath
from litestar.stores.memory import MemoryStore
from litestar.testing import TestClient, create_test_client

from app.db.engine import create_engine, make_sessionmaker
from app.db.migrate import upgrade_database
from app.domain.accounts.access import AccessCache
from app.domain.accounts.authentication import ACCESS_STATE_KEY, SessionAuthenticationMiddleware
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


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    """A migrated SQLite file holding ALICE, active."""
    path = tmp_path / "accounts.db"
    upgrade_database(f"sqlite+aiosqlite:///{path}")
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO users (id, email, password_hash, is_admin, created_at)"
            " VALUES (?, 'alice@example.com', 'x', 0, '2026-01-01 00:00:00')",
            (ALICE.bytes,),
        )
    yield path


def set_alice(database: Path, **values: object) -> None:
    with sqlite3.connect(database) as db:
        for column, value in values.items():
            db.execute(f"UPDATE users SET {column} = ? WHERE id = ?", (value, ALICE.bytes))


def client(database: Path) -> TestClient[Any]:
    sessions = RotatingSessionConfig(max_age=1000, store="sessions")

    def start(app: Any) -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{database}")
        app.state[ACCESS_STATE_KEY] = AccessCache(make_sessionmaker(engine), ttl_s=0)

    return create_test_client(
        [login, who, private_router],
        middleware=[sessions.middleware, DefineMiddleware(SessionAuthenticationMiddleware)],
        stores={"sessions": MemoryStore()},
        on_startup=[start],
    )


def test_anonymous_clients_pass_as_none_and_the_guard_refuses_them(database: Path) -> None:
    with client(database) as anonymous:
        assert anonymous.get("/who").json() == {"user": None, "auth": None}
        refused = anonymous.get("/private")
        assert refused.status_code == 401
        assert refused.json() == {"status_code": 401, "detail": "log in first"}
        assert anonymous.options("/private").status_code == 204


def test_the_sessions_user_id_is_the_connections_user(database: Path) -> None:
    with client(database) as alice:
        alice.post(f"/login/{ALICE}")
        assert alice.get("/who").json() == {"user": str(ALICE), "auth": "session"}
        assert alice.get("/private").text == str(ALICE)


def test_a_session_without_a_valid_user_id_is_anonymous(database: Path) -> None:
    with client(database) as odd:
        odd.post("/login/not-a-uuid")
        assert odd.get("/who").json() == {"user": None, "auth": None}
        assert odd.get("/private").status_code == 401


def test_a_disabled_or_unknown_account_loses_its_session(database: Path) -> None:
    with client(database) as alice:
        alice.post(f"/login/{ALICE}")
        assert alice.get("/private").status_code == 200
        set_alice(database, state="disabled")
        assert alice.get("/who").json() == {"user": None, "auth": None}
        set_alice(database, state="active")  # enabled again: the session is gone all the same
        assert alice.get("/private").status_code == 401
    with client(database) as stranger:
        stranger.post(f"/login/{uuid4()}")
        assert stranger.get("/who").json() == {"user": None, "auth": None}


def test_a_raised_epoch_ends_the_sessions_made_before_it(database: Path) -> None:
    with client(database) as alice:
        alice.post(f"/login/{ALICE}")  # no epoch in the session: 0, the account's too
        assert alice.get("/private").status_code == 200
        set_alice(database, session_epoch=1)  # "log out everywhere"
        assert alice.get("/private").status_code == 401
        assert alice.get("/who").json() == {"user": None, "auth": None}


def test_a_pending_account_is_kept_as_pending_and_refused_by_the_guard(database: Path) -> None:
    set_alice(database, state="pending")
    with client(database) as alice:
        alice.post(f"/login/{ALICE}")
        assert alice.get("/who").json() == {"user": None, "auth": "pending"}
        assert alice.get("/private").status_code == 401
        set_alice(database, state="active")  # approved: the same session goes on
        assert alice.get("/who").json() == {"user": str(ALICE), "auth": "session"}
