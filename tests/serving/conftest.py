"""Fixtures for the live-server tests: a database per module and backend, servers, users.

Each test module declares which engine its shared server runs by overriding `server_env_overrides`
(and `engine_kind`); the module's tests then share one server per database backend:

- `backend`: "sqlite" or "postgresql" (module-scoped parameter: every module runs on both unless
  it overrides `backend` with a plain fixture);
- `live_database_url`: a throwaway database of that backend for the module (a SQLite file, or a
  PostgreSQL database created for the module and dropped after it);
- `server`: a uvicorn subprocess on that database (migrated first), stopped after the module;
- `alice`: the first user to sign up, hence the admin (she can read `/admin/api/engine`);
  `bob`: a second, ordinary user.

When a test fails, the server logs written during it are attached to the report.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import (
    LiveServer,
    PageClient,
    running_server,
    server_env,
    throwaway_database,
)


def unique_email(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}@example.com"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    return tmp_path_factory.mktemp(f"live-{backend}")


@pytest.fixture(scope="module")
def live_database_url(backend: str, module_dir: Path) -> Iterator[str]:
    with throwaway_database(backend, module_dir) as url:
        yield url


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "llamacpp"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {}


@pytest.fixture(scope="module")
def server(
    engine_kind: str,
    live_database_url: str,
    module_dir: Path,
    server_env_overrides: dict[str, object],
) -> Iterator[LiveServer]:
    env = server_env(engine_kind, live_database_url, module_dir, **server_env_overrides)
    with running_server(env, module_dir / "server.log") as live:
        yield live


@pytest.fixture(scope="module")
def alice(server: LiveServer) -> Iterator[PageClient]:
    """The admin: the module's first sign-up."""
    client = PageClient(server.url)
    assert client.signup(unique_email("alice"))["is_admin"] is True
    yield client
    client.close()


@pytest.fixture(scope="module")
def bob(server: LiveServer, alice: PageClient) -> Iterator[PageClient]:
    """An ordinary user (signed up after alice)."""
    client = PageClient(server.url)
    assert client.signup(unique_email("bob"))["is_admin"] is False
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _mark_server_logs() -> None:
    for live in LiveServer.active:
        live.mark_log()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for live in LiveServer.active:
            report.sections.append((f"live server log ({live.url})", live.log_since_mark()))
