"""Sign-in by a trusted proxy's header (app/domain/accounts/trusted_header.py) in the whole app, over
Litestar's test client and a real SQLite database: what each SIGNUP_MODE makes of an unknown
email, a disabled account, another person behind the same browser, and a peer that is not a
trusted proxy. The test client's peer address is "testclient", which FORWARDED_ALLOW_IPS trusts
here as uvicorn would (a name, not an IP, is matched literally). Through the real nginx, and
refused from elsewhere: tests/ops/test_trusted_header.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from litestar.testing import TestClient

from app.db.migrate import upgrade_database
from app.settings import EngineSettings, Settings
from app.web.app import create_app

HEADER = "Remote-Email"


@contextmanager
def app_client(
    tmp_path: Path, mode: str, trusted: tuple[str, ...] = ("testclient",)
) -> Iterator[tuple[TestClient, Path]]:
    path = tmp_path / "db.sqlite"
    if not path.exists():
        upgrade_database(f"sqlite+aiosqlite:///{path}")
    settings = Settings(
        engine=EngineSettings(kind="synthetic"),
        database_url=f"sqlite+aiosqlite:///{path}",
        signup_mode=mode,  # type: ignore[arg-type]
        auth_trusted_email_header=HEADER,
        forwarded_allow_ips=trusted,
    )
    with TestClient(create_app(settings)) as client:
        yield client, path


def me(client: TestClient, email: str | None) -> tuple[int, dict[str, object]]:
    response = client.get("/api/me", headers={HEADER: email} if email else {})
    return response.status_code, response.json()


def test_open_makes_active_accounts_and_a_new_header_switches_the_user(tmp_path: Path) -> None:
    with app_client(tmp_path, "open") as (client, _):
        status, body = me(client, "Boss@Example.com")
        assert status == 200 and body["email"] == "boss@example.com" and body["is_admin"]
        status, body = me(client, "worker@example.com")  # another person, same browser
        assert status == 200 and body["email"] == "worker@example.com" and not body["is_admin"]
        assert body["state"] == "active"
        status, body = me(client, None)  # the session stands without the header
        assert status == 200 and body["email"] == "worker@example.com"


def test_approval_makes_pending_accounts_that_see_the_waiting_page(tmp_path: Path) -> None:
    with app_client(tmp_path, "approval") as (client, _):
        assert me(client, "first@example.com")[0] == 200  # the first account: the admin
        client.cookies.clear()
        assert me(client, "newcomer@example.com")[0] in (401, 403)
        page = client.get("/", headers={HEADER: "newcomer@example.com"})
        assert 'data-testid="waiting"' in page.text


def test_closed_and_invite_make_no_account_but_the_first(tmp_path: Path) -> None:
    for mode in ("closed", "invite"):
        with app_client(tmp_path / mode, mode) as (client, _):
            assert me(client, "first@example.com")[0] == 200
            client.cookies.clear()
            status, body = me(client, "stranger@example.com")
            assert status == 403 and "ask an admin" in str(body["detail"]), body


def test_a_disabled_account_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with app_client(tmp_path / "a", "open") as (client, path):
        assert me(client, "first@example.com")[0] == 200
        assert me(client, "gone@example.com")[0] == 200
        with sqlite3.connect(path) as db:
            db.execute("UPDATE users SET state = 'disabled' WHERE email = 'gone@example.com'")
        client.cookies.clear()
        status, body = me(client, "gone@example.com")
        assert status == 403 and "disabled" in str(body["detail"]), body


def test_the_header_from_a_peer_that_is_not_a_trusted_proxy_is_ignored(tmp_path: Path) -> None:
    with app_client(tmp_path, "open", trusted=("127.0.0.1",)) as (client, path):
        assert me(client, "first@example.com")[0] == 401
        # ...even when the request says it was forwarded by the trusted address
        response = client.get(
            "/api/me", headers={HEADER: "first@example.com", "X-Forwarded-For": "127.0.0.1"}
        )
        assert response.status_code == 401
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM users").fetchone() == (0,)
