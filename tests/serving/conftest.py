"""Fixtures for the live-server tests: servers shared per configuration and backend, users.

Each test module says which engine its server runs by overriding `engine_kind` and
`server_env_overrides`; its tests then get:

- `backend`: "sqlite" or "postgresql" (a module-scoped parameter: every module runs on both);
- `server`: a uvicorn subprocess (see tests/live_server.py) with that configuration, on a throwaway
  database of that backend (a SQLite file, or a PostgreSQL database created for it and dropped at
  the end), at the migrations' head: a copy of one `python -m app.cli db upgrade` built once per
  process (tests/live_databases.py);
- `live_database_url`: that database, to look at the rows directly;
- `alice`: the server's first sign-up, hence its admin (she can read `/admin/api/engine`);
  `bob`: an ordinary user.

Starting a server (imports, model load) costs seconds, so servers live in a
session-wide pool: modules that ask for the same configuration and backend share one server, its
database and its users. Tests never rely on what another test left behind (each makes its own
conversations) and always wait for their replies to end, so sharing is safe. A test that needs a
server of its own (to kill it, say) starts one with `running_server`.

When a test fails, the server logs written during it are attached to the report.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live_databases import migrated_database
from tests.live_server import LiveServer, PageClient, running_server, server_env


def unique_email(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}@example.com"


@dataclass
class PooledServer:
    server: LiveServer
    database_url: str
    alice: PageClient | None = None
    bob: PageClient | None = None


class ServerPool:
    """Servers started on first use, one per (backend, environment); all stopped at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._entries: dict[tuple[str, frozenset[tuple[str, str]]], PooledServer] = {}
        self._stack = contextlib.ExitStack()

    def get(self, backend: str, engine: str, overrides: dict[str, object]) -> PooledServer:
        config = server_env(engine, "", Path(), **overrides)
        del config["DATABASE_URL"], config["DATA_DIR"]
        key = (backend, frozenset(config.items()))
        if key not in self._entries:
            directory = self.base / f"{backend}-{engine}-{len(self._entries)}"
            directory.mkdir(parents=True)
            url = self._stack.enter_context(migrated_database(backend, directory))
            env = server_env(engine, url, directory, **overrides)
            live = self._stack.enter_context(running_server(env, directory / "server.log"))
            self._entries[key] = PooledServer(live, url)
        return self._entries[key]

    def close(self) -> None:
        for entry in self._entries.values():
            for client in (entry.alice, entry.bob):
                if client is not None:
                    client.close()
        self._stack.close()


@pytest.fixture(scope="session")
def server_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    pool = ServerPool(tmp_path_factory.mktemp("live-servers"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    """A directory for servers and databases a module starts on its own."""
    return tmp_path_factory.mktemp(f"live-{backend}")


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "llamacpp"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    # A small default reply length: a request that wrongly gets the default still ends quickly.
    return {"DEFAULT_MAX_TOKENS": 32}


@pytest.fixture(scope="module")
def pooled(
    server_pool: ServerPool,
    backend: str,
    engine_kind: str,
    server_env_overrides: dict[str, object],
) -> PooledServer:
    return server_pool.get(backend, engine_kind, server_env_overrides)


@pytest.fixture(scope="module")
def server(pooled: PooledServer) -> LiveServer:
    assert pooled.server.running, "the pooled server died"
    return pooled.server


@pytest.fixture(scope="module")
def live_database_url(pooled: PooledServer) -> str:
    return pooled.database_url


@pytest.fixture(scope="module")
def alice(pooled: PooledServer) -> PageClient:
    """The admin: the server's first sign-up."""
    if pooled.alice is None:
        client = PageClient(pooled.server.url)
        assert client.signup(unique_email("alice"))["is_admin"] is True
        pooled.alice = client
    return pooled.alice


@pytest.fixture(scope="module")
def bob(pooled: PooledServer, alice: PageClient) -> PageClient:
    """An ordinary user (signed up after alice)."""
    if pooled.bob is None:
        client = PageClient(pooled.server.url)
        assert client.signup(unique_email("bob"))["is_admin"] is False
        pooled.bob = client
    return pooled.bob


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
