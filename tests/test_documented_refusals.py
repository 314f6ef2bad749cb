"""The OpenAPI document's error answers come from each route's `raises=` (`documented`,
app/domain/refusals.py), Litestar's own refusals included: every route behind a guard lists its
401, every write its CSRF 403, and the routes a limit can refuse their 429. The whole app, over
Litestar's test client and a migrated SQLite database, gives those answers, in the shape the
document says. (Every operation fuzzed against its document: tests/serving/test_api_fuzz.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from app.db.migrate import upgrade_database
from app.domain.accounts.guards import admin_guard, logged_in
from app.settings import EngineSettings, Settings
from app.web.app import create_app

SAFE = {"GET", "HEAD", "OPTIONS"}  # what Litestar's CSRF check lets through


def build(tmp_path: Path) -> Litestar:
    url = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_database(url)
    settings = Settings(
        engine=EngineSettings(kind="synthetic"),
        database_url=url,
        login_max_per_address=1,  # the second log-in attempt is refused
    )
    return create_app(settings)


@pytest.fixture
def app(tmp_path: Path) -> Litestar:
    return build(tmp_path)


@pytest.fixture
def client(app: Litestar) -> Iterator[TestClient]:
    with TestClient(app) as client:
        client.get("/healthz")  # sets the CSRF cookie
        yield client


def operations(app: Litestar) -> Iterator[tuple[str, str, Any, dict[str, Any]]]:
    """(method, path, handler, the document's responses) for every documented page-API route."""
    paths = app.openapi_schema.to_schema()["paths"]
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or route.path_format not in paths:
            continue
        for handler in route.route_handlers:
            for method in handler.http_methods:
                operation = paths[route.path_format].get(method.lower())
                if operation is not None and not route.path_format.startswith("/v1/"):
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
