"""Fixtures for the Playwright end-to-end tests.

- `browser`: one headless Chromium (Debian's, /usr/bin/chromium) for the whole session.
- `backend` (module-scoped, "sqlite" unless a module overrides it) and `server_env_overrides`.
- `server`: a live uvicorn server per module with the real SmolLM2 model (ENGINE=llamacpp) on a
  throwaway database of that backend, already migrated (a copy of a template the real migrations
  built once, tests/live_databases.py); `database_url` is that database.
- `admin`: a browser context logged in as the module's first sign-up, hence the admin.
- `new_user`: makes more logged-in browser contexts (a fresh ordinary user each), closed after
  the test. Every page of these contexts is watched: an uncaught page error or a violation of the
  Content-Security-Policy fails the test, and a failing test leaves screenshots of its pages in
  artifacts/failures/.

When a test fails, the server log written during it is attached to the report.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, sync_playwright

from e2e.helpers import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    CHROMIUM_PATH,
    api_signup,
    in_thread,
    unique_email,
)
from tests.live_databases import migrated_database
from tests.live_server import LiveServer, server_env

# Short enough to keep each reply a few seconds long on two cores, long enough to Stop mid-reply.
E2E_ENV: dict[str, object] = {
    "DEFAULT_MAX_TOKENS": 100,
    # A page whose network drops for a couple of seconds must find its reply still running.
    "PAGE_GRACE_S": 15,
}


@pytest.fixture(scope="session", autouse=True)
def _fresh_failure_screenshots() -> None:
    """artifacts/failures/ shows the failures of this run only."""
    shutil.rmtree(ARTIFACTS / "failures", ignore_errors=True)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def backend() -> str:
    return "sqlite"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {}


@pytest.fixture(scope="module")
def engine_kind() -> str:
    """The server's engine: an ENGINE value, or "trtllm-fake" (tests/live_server.py)."""
    return "llamacpp"


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    return tmp_path_factory.mktemp(f"e2e-{backend}")


@pytest.fixture(scope="module")
def database_url(backend: str, module_dir: Path) -> Iterator[str]:
    # migrated_database uses asyncio.run(): off the main thread, where Playwright's loop runs.
    manager = migrated_database(backend, module_dir)
    url = in_thread(manager.__enter__)
    try:
        yield url
    finally:
        in_thread(manager.__exit__, None, None, None)


@pytest.fixture(scope="module")
def server(
    database_url: str,
    module_dir: Path,
    server_env_overrides: dict[str, object],
    engine_kind: str,
) -> Iterator[LiveServer]:
    env = server_env(engine_kind, database_url, module_dir, **{**E2E_ENV, **server_env_overrides})
    live = LiveServer(env, module_dir / "server.log", migrate=False)
    try:
        yield live.start()
    finally:
        live.stop()


@dataclass
class User:
    email: str
    context: BrowserContext
    is_admin: bool
    page_errors: list[str] = field(default_factory=list)

    @property
    def page(self) -> Page:
        """The context's first page (opened on demand)."""
        return self.context.pages[0] if self.context.pages else self.context.new_page()


# Every page reports what the Content-Security-Policy blocks (the event carries the directive and
# the blocked URL); Chromium also logs each block to the console as "Refused to ...".
REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline"}`));
"""


def watch_pages(context: BrowserContext, errors: list[str]) -> None:
    """Collect every uncaught error and every CSP violation of `context`'s pages into `errors`."""
    context.add_init_script(REPORT_CSP_VIOLATIONS)

    def on_console(message: ConsoleMessage) -> None:
        text = message.text
        if "CSP violation" in text or "Content Security Policy" in text:
            errors.append(text)

    def watch(page: Page) -> None:
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", on_console)

    context.on("page", watch)


def _open_context(browser: Browser, server: LiveServer) -> tuple[BrowserContext, list[str]]:
    context = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 800})
    context.set_default_timeout(15_000)
    errors: list[str] = []
    watch_pages(context, errors)
    return context, errors


def _signed_up(browser: Browser, server: LiveServer, name: str) -> User:
    context, errors = _open_context(browser, server)
    email = unique_email(name)
    me = api_signup(context, email)
    return User(email, context, me["is_admin"], errors)


@pytest.fixture(scope="module")
def admin(browser: Browser, server: LiveServer) -> Iterator[User]:
    user = _signed_up(browser, server, "admin")
    assert user.is_admin, "the module's first sign-up is not the admin"
    yield user
    user.context.close()


@pytest.fixture
def new_user(
    browser: Browser, server: LiveServer, admin: User, request: pytest.FixtureRequest
) -> Iterator[Callable[..., User]]:
    """Sign up a fresh ordinary user in a new browser context (after the admin exists)."""
    users: list[User] = []

    def make(name: str = "user") -> User:
        user = _signed_up(browser, server, name)
        assert not user.is_admin
        users.append(user)
        return user

    yield make
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for number, user in enumerate([*users, admin]):
        if failed:
            save_failure_screenshots(request.node.nodeid, number, user.context)
        if user is not admin:
            user.context.close()
    errors = [e for u in [*users, admin] for e in u.page_errors]
    admin.page_errors.clear()
    assert not errors, f"uncaught errors in the page: {errors}"


def save_failure_screenshots(nodeid: str, number: int, context: BrowserContext) -> None:
    folder = ARTIFACTS / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)
    for index, page in enumerate(context.pages):
        try:
            page.screenshot(path=str(folder / f"{stem}-{number}-{index}.png"), full_page=True)
        except Exception as exc:  # a crashed page must not hide the test's own failure
            print(f"no screenshot of {page.url}: {exc!r}")


@pytest.fixture(autouse=True)
def _mark_server_logs() -> None:
    for live in LiveServer.active:
        live.mark_log()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    if report.failed and report.when == "call":
        for live in LiveServer.active:
            report.sections.append((f"live server log ({live.url})", live.log_since_mark()))
