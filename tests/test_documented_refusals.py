"""The OpenAPI document's error answers come from each route's `raises=` (`documented`,
app/domain/refusals.py), Litestar's own refusals included: every route behind a guard lists its
401, every write its CSRF 403, the routes a limit can refuse their 429, every route the database's
503 and every route that reads a body its 413. The whole app, over Litestar's test client and a
migrated SQLite database, gives those answers, in the shape the document says. (Every operation
fuzzed against its document: tests/serving/test_api_fuzz.py.)"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient
from litestar.types import Empty

from app.db.migrate import upgrade_database
from app.domain.accounts.guards import admin_guard, logged_in
from app.settings import EngineSettings, Settings
from app.web.app import PROBES, create_app
from tests.live_server import TEST_PASSWORD

SAFE = {"GET", "HEAD", "OPTIONS"}  # what Litestar's CSRF check lets through


def build(tmp_path: Path, **settings: Any) -> Litestar:
    url = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_database(url)
    return create_app(
        Settings(
            engine=EngineSettings(kind="synthetic"),
            database_url=url,
            login_max_per_address=1,  # the second log-in attempt is refused
            **settings,
        )
    )


@pytest.fixture
def app(tmp_path: Path) -> Litestar:
    return build(tmp_path)


@pytest.fixture
def client(app: Litestar) -> Iterator[TestClient]:
    with TestClient(app) as client:
        client.get("/healthz")  # sets the CSRF cookie
        yield client


def operations(app: Litestar, v1: bool = False) -> Iterator[tuple[str, str, Any, dict[str, Any]]]:
    """(method, path, handler, the document's responses) for every documented page-API route, and
    `/v1`'s too if asked."""
    paths = app.openapi_schema.to_schema()["paths"]
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or route.path_format not in paths:
            continue
        for handler in route.route_handlers:
            for method in handler.http_methods:
                operation = paths[route.path_format].get(method.lower())
                if operation is not None and (v1 or not route.path_format.startswith("/v1/")):
                    yield method, route.path_format, handler, operation["responses"]


def test_every_guarded_route_lists_its_401_and_every_write_its_csrf_403(app: Litestar) -> None:
    checked = {"401": 0, "403": 0}
    for method, path, handler, responses in operations(app):
        guards = handler.resolve_guards()
        if logged_in in guards or admin_guard in guards:
            assert "401" in responses, f"{method} {path}"
            checked["401"] += 1
        if admin_guard in guards or method not in SAFE:
            assert "403" in responses, f"{method} {path}"
            checked["403"] += 1
    assert checked["401"] > 40 and checked["403"] > 30  # not vacuous


def test_the_routes_a_limit_can_refuse_list_their_429(app: Litestar) -> None:
    limited = {
        ("POST", "/api/auth/login"),
        ("POST", "/api/auth/signup"),
        ("POST", "/api/account/password"),
        ("POST", "/api/account/delete"),
        ("POST", "/api/conversations/{conversation_id}/messages"),
        ("POST", "/api/messages/{message_id}/regenerate"),
        ("POST", "/api/messages/{message_id}/edit"),
    }
    listed = {(m, p) for m, p, _, responses in operations(app) if "429" in responses}
    assert listed == limited


def reads_a_body(handler: Any) -> bool:
    """A `data` parameter, or a body read raw under the route's own size limit (the imports)."""
    return (
        "data" in handler.parsed_fn_signature.parameters
        or handler.request_max_body_size is not Empty
    )


def test_every_route_lists_the_databases_503_and_every_route_with_a_body_its_413(
    app: Litestar,
) -> None:
    """Every documented route reads the database, if only for the session's user (the page API)
    or the API key's owner (`/v1`); the probes, which never do, are not in the document."""
    paths = app.openapi_schema.to_schema()["paths"]
    assert not [path for path in paths if any(re.match(probe, path) for probe in PROBES)]
    checked = {"503": 0, "413": 0, "no 413": 0}
    for method, path, handler, responses in operations(app, v1=True):
        assert "503" in responses, f"{method} {path}"
        checked["503"] += 1
        if reads_a_body(handler):
            assert "413" in responses, f"{method} {path}"
            checked["413"] += 1
        else:
            assert "413" not in responses, f"{method} {path}"
            checked["no 413"] += 1
    assert checked["503"] > 50 and checked["413"] > 20 and checked["no 413"] > 30  # not vacuous


def schema_of(app: Litestar, method: str, path: str, status: int) -> dict[str, Any]:
    document = app.openapi_schema.to_schema()
    answer = document["paths"][path][method]["responses"][str(status)]
    schema = answer["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def assert_fits(body: dict[str, Any], schema: dict[str, Any]) -> None:
    assert set(schema["required"]) <= set(body) <= set(schema["properties"]), (body, schema)


def test_the_newly_listed_answers_are_given_in_the_documented_shape(
    app: Litestar, client: TestClient
) -> None:
    token = {"x-csrftoken": client.cookies["csrftoken"]}
    credentials = {"email": "nobody@example.com", "password": "not the password"}
    answers = {
        ("post", "/api/auth/logout", 403): client.post("/api/auth/logout"),  # no CSRF token
        ("get", "/api/me", 401): client.get("/api/me"),
        ("get", "/api/keys", 401): client.get("/api/keys"),
        ("post", "/api/auth/login", 401): client.post(
            "/api/auth/login", json=credentials, headers=token
        ),
        ("post", "/api/auth/login", 429): client.post(
            "/api/auth/login", json=credentials, headers=token
        ),
    }
    for (method, path, status), answer in answers.items():
        assert answer.status_code == status, (path, answer.text)
        assert_fits(answer.json(), schema_of(app, method, path, status))
    # The log-in limits' own body: no `status_code`, and a Retry-After.
    limited = answers["post", "/api/auth/login", 429]
    assert set(limited.json()) == {"detail"} and "retry-after" in limited.headers


def test_the_databases_503_and_a_bodys_413_are_given_in_the_documented_shape(
    tmp_path: Path,
) -> None:
    app = build(tmp_path, database_busy_timeout_s=0.1)  # a write kept waiting fails fast
    limits = {  # each route's own, or Litestar's default (10 MB)
        (m.lower(), p): h.resolve_request_max_body_size() for m, p, h, _ in operations(app, v1=True)
    }
    with TestClient(app) as client:
        client.get("/healthz")  # sets the CSRF cookie
        token = {"x-csrftoken": client.cookies["csrftoken"]}
        account = {"email": "someone@example.com", "password": TEST_PASSWORD}
        assert client.post("/api/auth/signup", json=account, headers=token).status_code == 201
        key = client.post("/api/keys", json={"name": "k"}, headers=token).json()["secret"]
        bearer = {"authorization": f"Bearer {key}"}
        # Another connection holds SQLite's write lock: the app's writes wait out the busy timeout.
        holder = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            answers = {
                ("post", "/api/conversations", 503): client.post(
                    "/api/conversations", json={}, headers=token
                ),
                # The key's first use is noted (`last_used_at`): a write, in /v1's middleware.
                ("get", "/v1/models", 503): client.get("/v1/models", headers=bearer),
            }
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        for method, path in [
            ("post", "/api/conversations/import"),
            ("post", "/v1/chat/completions"),
        ]:
            answers[method, path, 413] = client.post(
                path, content=b"x" * (limits[method, path] + 1), headers={**token, **bearer}
            )
    for (method, path, status), answer in answers.items():
        assert answer.status_code == status, (path, answer.text)
        assert_fits(answer.json(), schema_of(app, method, path, status))
        if status == 503:
            assert "retry-after" in answer.headers
