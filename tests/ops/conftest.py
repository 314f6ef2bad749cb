"""Fixtures for the ops tests: a synthetic-engine app behind the real nginx config, and its control.

`streaming_app` is one replica started from the Procfile (synthetic engine, 30 ms per step, its
own throwaway PostgreSQL database); `good_proxy` is deploy/nginx.conf in front of it and
`buffering_proxy` the same config with buffering switched on (the control). Both live for the
whole session: test_nginx.py and test_stream_health.py share them. Every process is ended at
teardown; when a test fails, the logs of the processes still running are printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import PageClient
from tests.ops.harness import (
    STEP_MS,
    AppProcess,
    Database,
    Managed,
    Nginx,
    buffering_variant,
    proxy_for,
    release,
    start_nginx,
    throwaway_database,
)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.when == "call" and report.failed:
        for managed in Managed.running:
            report.sections.append((f"log of {managed.name}", managed.log_text()[-6000:]))
    return report


@pytest.fixture(scope="session")
def ops_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ops-logs")


@pytest.fixture(scope="session")
def streaming_db() -> Iterator[Database]:
    with throwaway_database() as database:
        yield database


@pytest.fixture(scope="session")
def streaming_app(streaming_db: Database, ops_logs: Path) -> Iterator[AppProcess]:
    env = {
        "ENGINE": "synthetic",
        "SYNTHETIC_STEP_MS": str(STEP_MS),
        "DATABASE_URL": streaming_db.url,
        "REPLICA_ID": "stream",
    }
    log = ops_logs / "streaming_app.log"
    assert release(env, log).returncode == 0, log.read_text()
    app = AppProcess("streaming_app", env, log)
    try:
        yield app.start().wait_ready()
    finally:
        app.stop()


@pytest.fixture(scope="session")
def good_proxy(streaming_app: AppProcess) -> Iterator[Nginx]:
    nginx = start_nginx("good", proxy_for("good", (streaming_app, streaming_app), "60s"))
    try:
        yield nginx
    finally:
        nginx.stop()


@pytest.fixture(scope="session")
def buffering_proxy(streaming_app: AppProcess) -> Iterator[Nginx]:
    conf = buffering_variant(proxy_for("buffering", (streaming_app, streaming_app), "60s"))
    nginx = start_nginx("buffering", conf)
    try:
        yield nginx
    finally:
        nginx.stop()


@pytest.fixture(scope="session")
def admin(streaming_app: AppProcess) -> Iterator[PageClient]:
    """The first account on the streaming app, hence its admin; talks to the app directly."""
    client = PageClient(streaming_app.url)
    client.signup("ops-admin@example.com")
    try:
        yield client
    finally:
        client.close()
