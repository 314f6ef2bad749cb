"""Property-based fuzzing of the HTTP API from its own OpenAPI document, with schemathesis.

Schemathesis reads `/schema/openapi.json` (which Litestar builds from the route handlers' signatures
and return annotations) and calls every operation in it with generated requests, in process through
the ASGI interface (schemathesis/python/asgi.py runs the app's lifespan once, then each request).
Every response must pass three checks:

- `not_a_server_error`: no 5xx, whatever the input;
- `status_code_conformance`: its status is one the document lists for the operation;
- `response_schema_conformance`: it matches that status's schema (the document does not lie
  about what comes back).

The app runs for real: migrated SQLite and PostgreSQL databases, the synthetic engine (ENGINE=
synthetic: the engine is not what is fuzzed, and it keeps the run fast), its real middleware
(sessions, CSRF). Requests go out logged in, as an ordinary user and as the admin (session cookie,
CSRF header, and a bearer API key for `/v1`). The sign-up, log-in and log-out operations get a
client of their own, so that what they do to their session does not change who the others run as.

The run is bounded: MAX_EXAMPLES generated requests per operation and database, each sent once
per role.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from app.settings import EngineSettings, Settings
from app.web.app import create_app
from tests.live_databases import migrated_database
from tests.live_server import TEST_PASSWORD

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]
SESSION_CHANGING = ("/api/auth/",)  # sign-up, log-in and log-out replace or end the session


@dataclass
class Account:
    """A logged-in client of the in-process app, with what its requests must carry."""

    http: asgi.ASGIClient
    headers: dict[str, str]

    def real_ids(self) -> dict[str, str]:
        """Ids of things this account owns, fresh for each operation (the one before may have
        deleted them): a conversation with a finished reply, and an API key it can revoke. The
        fuzzer's own ids are random UUIDs, which only ever find 404s."""
        created = self.http.post("/api/conversations", json={}, headers=self.headers)
        assert created.status_code == 201, created.text
        conversation_id = created.json()["id"]
        sent = self.http.post(
            f"/api/conversations/{conversation_id}/messages",
            json={"content": "[[synthetic:tokens=3]] Hi", "max_tokens": 5},
            headers=self.headers,
        )
        assert sent.status_code == 200 and "event: final" in sent.text, sent.text
        start = next(line for line in sent.text.splitlines() if line.startswith("data: "))
        key = self.http.post("/api/keys", json={"name": "spare"}, headers=self.headers)
        assert key.status_code == 201, key.text
        return {
            "conversation_id": conversation_id,
            "message_id": json.loads(start.removeprefix("data: "))["message_id"],
            "key_id": key.json()["id"],
        }


def logged_in(app: object, email: str | None) -> Account:
    """A client with a CSRF cookie; signed up (so logged in) as `email` unless None."""
    http = asgi.get_client(app).__enter__()  # type: ignore[arg-type]
    http.get("/healthz").raise_for_status()  # sets the csrftoken cookie
    headers = {"x-csrftoken": http.cookies["csrftoken"]}
    if email is None:
        return Account(http, headers)
    response = http.post(
        "/api/auth/signup", json={"email": email, "password": TEST_PASSWORD}, headers=headers
    )
    assert response.status_code == 201, response.text
    key = http.post("/api/keys", json={"name": "fuzz"}, headers=headers)
    assert key.status_code == 201, key.text
    return Account(http, {**headers, "authorization": f"Bearer {key.json()['secret']}"})


@dataclass
class FuzzedApp:
    schema: schemathesis.BaseSchema
    admin: Account
    user: Account
    anonymous: Account
    model: str


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed_app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzedApp]:
    directory: Path = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    with migrated_database(request.param, directory) as url:
        app = create_app(
            Settings(engine=EngineSettings(kind="synthetic"), database_url=url, signup_mode="open")
        )
        tag = secrets.token_hex(4)
        admin = logged_in(app, f"admin-{tag}@example.com")  # the first sign-up is the admin
        # The document is served to admins only (app/web/app.py): load it as the admin.
        schema = schemathesis.openapi.from_asgi(
            "/schema/openapi.json", app, cookies=dict(admin.http.cookies)
        )
        user = logged_in(app, f"user-{tag}@example.com")
        try:
            model = user.http.get("/v1/models", headers=user.headers).json()["data"][0]["id"]
            yield FuzzedApp(schema, admin, user, logged_in(app, None), model)
        finally:
            asgi.shutdown_lifespans()  # ends open replies, closes the database pool


@contextlib.contextmanager
def aimed_at_real_values(
    case: schemathesis.Case, ids: dict[str, str], model: str
) -> Iterator[schemathesis.Case]:
    """The same request, aimed at things that exist (real ids in the path, the real model) while
    the block runs; the case as generated afterwards."""
    path_parameters, body = case.path_parameters, case.body
    case.path_parameters = {
        name: ids.get(name, value) for name, value in (path_parameters or {}).items()
    }
    if isinstance(body, dict) and "model" in body:
        case.body = {**body, "model": model}
    try:
        yield case
    finally:
        case.path_parameters, case.body = path_parameters, body


def failures_of(operation: APIOperation, fuzzed_app: FuzzedApp) -> str | None:
    """Run MAX_EXAMPLES generated requests (valid and invalid ones) at one operation, each as the
    user and as the admin, about half of them aimed at real ids; the first (shrunk) failure, or
    None."""
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )
    if operation.path.startswith(SESSION_CHANGING):
        accounts = [(fuzzed_app.anonymous, {})]
    else:
        accounts = [(a, a.real_ids()) for a in (fuzzed_app.user, fuzzed_app.admin)]

    @given(case=strategy, aim_at_real=st.booleans())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,  # no example database: each run is bounded and independent
        derandomize=True,  # the same requests every run: a failure here is reproducible
    )
    def run(case: schemathesis.Case, aim_at_real: bool) -> None:
        for account, ids in accounts:
            with aimed_at_real_values(case, ids if aim_at_real else {}, fuzzed_app.model):
                case.call_and_validate(session=account.http, headers=account.headers, checks=CHECKS)

    try:
        run()
    except Exception as exc:  # a failed check (or several): report it with the others
        return f"{operation.method.upper()} {operation.path}:\n{exc}"
    return None


@pytest.mark.timeout(900)  # ~60 operations x 25 examples x 2 roles: minutes on a loaded machine
def test_api_never_errs_and_keeps_to_its_schema(fuzzed_app: FuzzedApp) -> None:
    """Every operation in the OpenAPI document, fuzzed: no server error, no response that breaks
    the schema the document gives for its status."""
    operations = [result.ok() for result in fuzzed_app.schema.get_all_operations()]
    assert len(operations) >= 20, [f"{o.method} {o.path}" for o in operations]
    failures = [f for operation in operations if (f := failures_of(operation, fuzzed_app))]
    assert not failures, "\n\n".join(failures)
