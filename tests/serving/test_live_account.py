"""A user's own account page and API (issue 24 item 4, and item 6's "who looked"), against a real
server on SQLite and PostgreSQL: the sessions of an account listed and ended one by one or all but
this one (the ended browser's next request is logged out), the password changed with the current
one, every conversation exported in one file and imported back, the admins' looks, and the account
deleted with everything of theirs. Every write needs the CSRF header and acts on the user's own
things only.

The synthetic engine: the replies are not the point."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_databases import migrated_database
from tests.live_server import (
    TEST_PASSWORD,
    LiveServer,
    PageClient,
    query,
    running_server,
    server_env,
)
from tests.serving.conftest import unique_email

EFFECTIVE_S = 1.5  # a session's row is re-read at most once a second per process
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
NEW_PASSWORD = "a new and longer passphrase"


@pytest.fixture(scope="module")
def database_url(module_dir: Path, backend: str) -> Iterator[str]:
    with migrated_database(backend, module_dir / "account") as url:
        yield url


@pytest.fixture(scope="module")
def server(module_dir: Path, database_url: str) -> Iterator[LiveServer]:
    """A server of its own: these tests delete accounts, the admin's included when allowed."""
    env = server_env("synthetic", database_url, module_dir, SIGNUP_MODE="open")
    with running_server(env, module_dir / "account-server.log") as live:
        yield live


@pytest.fixture(scope="module")
def admin(server: LiveServer) -> Iterator[PageClient]:
    client = PageClient(server.url)
    assert client.signup(unique_email("admin"))["is_admin"] is True
    yield client
    client.close()


@pytest.fixture
def clients(server: LiveServer, admin: PageClient) -> Iterator[Callable[..., PageClient]]:
    """Make page clients (a fresh browser each); all closed after the test."""
    made: list[PageClient] = []

    def make(user_agent: str | None = None) -> PageClient:
        client = PageClient(server.url)
        if user_agent:
            client.http.headers["user-agent"] = user_agent
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def within(seconds: float, check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def logged_in(client: PageClient) -> bool:
    return client.http.get("/api/me").status_code == 200


def second_browser(make: Callable[..., PageClient], email: str) -> PageClient:
    other = make(FIREFOX)
    other.login(email)
    return other


def sessions_of(client: PageClient) -> list[dict[str, Any]]:
    response = client.http.get("/api/account/sessions")
    assert response.status_code == 200, response.text
    return response.json()


def reply(client: PageClient, conversation_id: str, text: str) -> str:
    """Send a message and read the reply to its end; the reply's message id."""
    with client.send(conversation_id, f"[[synthetic:tokens=3]] {text}", max_tokens=5) as response:
        body = response.read().decode()
    assert response.status_code == 200 and "event: final" in body, body
    start = next(line for line in body.splitlines() if line.startswith("data: "))
    return json.loads(start.removeprefix("data: "))["message_id"]


def by_id(database_url: str, user_id: str) -> object:
    """A user id as the database compares it (16 bytes on SQLite, a uuid on PostgreSQL)."""
    return uuid.UUID(user_id).bytes if database_url.startswith("sqlite") else user_id


def test_sessions_are_listed_and_one_logged_out_from_another(
    clients: Callable[..., PageClient],
) -> None:
    first = clients()
    email = unique_email("sessions")
    first.signup(email)
    second = second_browser(clients, email)

    listed = sessions_of(first)
    assert len(listed) == 2
    this, other = sorted(listed, key=lambda s: not s["current"])
    assert this["current"] is True and other["current"] is False
    assert other["browser"] == "Firefox on Linux" and other["user_agent"] == FIREFOX
    assert other["address"] == "127.0.0.1" and other["last_seen_at"] and other["created_at"]
    assert [s["current"] for s in sessions_of(second)].count(True) == 1

    # Someone else cannot end it: their 404 says nothing about whether it exists.
    stranger = clients()
    stranger.signup(unique_email("stranger"))
    refused = stranger.http.delete(
        f"/api/account/sessions/{other['id']}", headers=stranger.csrf_headers()
    )
    assert refused.status_code == 404
    assert logged_in(second)

    ended = first.http.delete(f"/api/account/sessions/{other['id']}", headers=first.csrf_headers())
    assert ended.status_code == 204
    assert within(EFFECTIVE_S, lambda: not logged_in(second))
    assert second.http.get("/", follow_redirects=False).headers["location"] == "/login"
    assert logged_in(first)
    assert [s["id"] for s in sessions_of(first)] == [this["id"]]
    again = first.http.delete(f"/api/account/sessions/{other['id']}", headers=first.csrf_headers())
    assert again.status_code == 404

    # Logging out takes the session off the list too.
    third = second_browser(clients, email)
    assert len(sessions_of(first)) == 2
    assert third.post("/api/auth/logout").status_code == 204
    assert [s["id"] for s in sessions_of(first)] == [this["id"]]


def test_log_out_all_other_sessions_keeps_this_one(clients: Callable[..., PageClient]) -> None:
    first = clients()
    email = unique_email("others")
    first.signup(email)
    others = [second_browser(clients, email) for _ in range(2)]
    assert len(sessions_of(first)) == 3

    response = first.post("/api/account/sessions/end-others")
    assert response.status_code == 200 and response.json() == {"ended": 2}
    assert within(EFFECTIVE_S, lambda: not any(logged_in(o) for o in others))
    for _ in range(5):  # and it stays so, on every request
        assert logged_in(first)
    assert [s["current"] for s in sessions_of(first)] == [True]
    assert first.new_conversation()


def test_changing_the_password_needs_the_current_one_and_ends_the_other_sessions(
    clients: Callable[..., PageClient],
) -> None:
    first = clients()
    email = unique_email("password")
    first.signup(email)
    second = second_browser(clients, email)

    wrong = first.post(
        "/api/account/password",
        {"current_password": "not my password", "new_password": NEW_PASSWORD},
    )
    assert wrong.status_code == 403 and "wrong" in wrong.json()["detail"]
    weak = first.post(
        "/api/account/password", {"current_password": TEST_PASSWORD, "new_password": "short"}
    )
    assert weak.status_code == 400
    assert logged_in(second)

    cookie_before = first.http.cookies["session"]
    changed = first.post(
        "/api/account/password",
        {"current_password": TEST_PASSWORD, "new_password": NEW_PASSWORD},
    )
    assert changed.status_code == 204, changed.text
    assert first.http.cookies["session"] != cookie_before  # this session lives on, under a new id
    assert within(EFFECTIVE_S, lambda: not logged_in(second))
    for _ in range(5):
        assert logged_in(first)
    assert len(sessions_of(first)) == 1

    old = clients()
    refused = old.post("/api/auth/login", {"email": email, "password": TEST_PASSWORD})
    assert refused.status_code == 401
    old.login(email, NEW_PASSWORD)
    assert logged_in(old)


def test_account_routes_need_a_session_and_the_csrf_header(
    server: LiveServer, clients: Callable[..., PageClient]
) -> None:
    user = clients()
    user.signup(unique_email("csrf"))
    session_id = sessions_of(user)[0]["id"]
    writes = [
        (
            "POST",
            "/api/account/password",
            {"current_password": TEST_PASSWORD, "new_password": NEW_PASSWORD},
        ),
        ("POST", "/api/account/sessions/end-others", None),
        ("DELETE", f"/api/account/sessions/{session_id}", None),
        ("POST", "/api/account/import", {"format": "streamchat.conversations"}),
        ("POST", "/api/account/delete", {"password": TEST_PASSWORD}),
    ]
    for method, path, body in writes:  # logged in, without the header: refused, nothing done
        response = user.http.request(method, path, json=body)
        assert response.status_code == 403, (method, path, response.text)
    assert logged_in(user) and len(sessions_of(user)) == 1

    anonymous = clients()
    for method, path, body in writes:
        response = anonymous.http.request(method, path, json=body, headers=anonymous.csrf_headers())
        assert response.status_code == 401, (method, path, response.text)
    for path in ("/api/account/sessions", "/api/account/views", "/api/account/export"):
        assert anonymous.http.get(path).status_code == 401, path
    page = anonymous.http.get("/account", follow_redirects=False)
    assert page.status_code in (302, 303, 307) and page.headers["location"] == "/login"
    shown = user.http.get("/account")
    assert shown.status_code == 200 and 'data-testid="password-form"' in shown.text


def test_every_conversation_exports_in_one_file_that_imports_back(
    clients: Callable[..., PageClient],
) -> None:
    owner = clients()
    owner.signup(unique_email("exporter"))
    first = owner.new_conversation()
    reply(owner, first, "first question")
    second = owner.new_conversation()
    reply(owner, second, "second question")
    reply(owner, second, "a follow-up")

    response = owner.http.get("/api/account/export")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert "attachment" in response.headers["content-disposition"]
    bundle = response.json()
    assert bundle["format"] == "streamchat.conversations"
    assert [len(c["messages"]) for c in bundle["conversations"]] == [2, 4]
    assert all(c["format"] == "streamchat.conversation" for c in bundle["conversations"])
    single = owner.http.get(f"/api/conversations/{second}/export").json()
    assert bundle["conversations"][1]["messages"] == single["messages"]

    # One-conversation import says where a whole account's file goes.
    other = clients()
    other.signup(unique_email("importer"))
    misplaced = other.post("/api/conversations/import", bundle)
    assert misplaced.status_code == 400 and "account page" in misplaced.json()["detail"]
    imported = other.post("/api/account/import", bundle)
    assert imported.status_code == 201, imported.text
    assert len(imported.json()) == 2
    mine = {c["id"] for c in other.http.get("/api/conversations").json()}
    assert {c["id"] for c in imported.json()} <= mine
    contents = [m["content"] for m in other.conversation(imported.json()[1]["id"])["messages"]]
    assert any("a follow-up" in c for c in contents)
    # A one-conversation file imports here too; anything else is refused, nothing written.
    assert len(other.post("/api/account/import", single).json()) == 1
    broken = {**bundle, "conversations": [{**bundle["conversations"][0], "messages": "no"}]}
    refused = other.post("/api/account/import", broken)
    assert refused.status_code == 400 and "conversations[0]" in refused.json()["detail"]
    assert other.post("/api/account/import", {"format": "x"}).status_code == 400
    count = len(other.http.get("/api/conversations").json())
    assert count == 3


def test_the_user_sees_which_admin_looked_at_their_conversations(
    admin: PageClient, clients: Callable[..., PageClient]
) -> None:
    user = clients()
    user.signup(unique_email("watched"))
    assert user.http.get("/api/account/views").json() == []
    conversation = user.new_conversation()
    assert admin.http.get(f"/admin/conversations/{conversation}").status_code == 200
    exported = admin.http.get(f"/admin/api/conversations/{conversation}/export")
    assert exported.status_code == 200
    own = admin.new_conversation()  # an admin's look at their own is not one
    assert admin.http.get(f"/admin/conversations/{own}").status_code == 200

    looks = user.http.get("/api/account/views").json()
    assert [look["action"] for look in looks] == ["export_conversation", "view_conversation"]
    assert {look["admin_email"] for look in looks} == {admin.email}
    assert {look["conversation_id"] for look in looks} == {conversation}
    assert all(look["conversation_title"] and look["at"] for look in looks)
    assert admin.http.get("/api/account/views").json() == []


def test_deleting_the_account_takes_everything_of_theirs(
    server: LiveServer,
    admin: PageClient,
    database_url: str,
    clients: Callable[..., PageClient],
) -> None:
    user = clients()
    email = unique_email("leaver")
    user_id = user.signup(email)["id"]
    conversation = user.new_conversation()
    message = reply(user, conversation, "rate me")
    assert (
        user.http.put(
            f"/api/messages/{message}/rating", json={"rating": "up"}, headers=user.csrf_headers()
        ).status_code
        == 200
    )
    secret = user.post("/api/keys", {"name": "script"}).json()["secret"]
    bearer = {"authorization": f"Bearer {secret}"}
    assert httpx.get(f"{server.url}/v1/models", headers=bearer).status_code == 200
    elsewhere = second_browser(clients, email)
    admin.http.get(f"/admin/conversations/{conversation}").raise_for_status()  # an audit entry

    wrong = user.post("/api/account/delete", {"password": "not my password"})
    assert wrong.status_code == 403
    assert logged_in(user)

    deleted = user.post("/api/account/delete", {"password": TEST_PASSWORD})
    assert deleted.status_code == 204, deleted.text
    assert not logged_in(user)
    assert within(EFFECTIVE_S, lambda: not logged_in(elsewhere))
    assert httpx.get(f"{server.url}/v1/models", headers=bearer).status_code == 401
    assert (
        user.post("/api/auth/login", {"email": email, "password": TEST_PASSWORD}).status_code == 401
    )

    uid = by_id(database_url, user_id)
    for table in ("users", "conversations", "api_keys", "account_sessions", "reply_ratings"):
        column = "id" if table == "users" else "user_id"
        rows = query(database_url, f"SELECT count(*) AS n FROM {table} WHERE {column} = :u", u=uid)
        assert rows[0]["n"] == 0, table
    # The audit log keeps what happened to them, by their id.
    entries = admin.http.get("/admin/api/audit", params={"who": user_id}).json()["entries"]
    assert [e["action"] for e in entries] == ["delete", "view_conversation"]
    assert entries[0]["actor_email"] == email and entries[0]["target_id"] == user_id


def test_the_last_admin_cannot_delete_their_account(admin: PageClient) -> None:
    refused = admin.post("/api/account/delete", {"password": TEST_PASSWORD})
    assert refused.status_code == 409 and "admin" in refused.json()["detail"]
    assert logged_in(admin)
