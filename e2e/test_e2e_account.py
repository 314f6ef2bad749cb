"""The account page (issue 24 item 4, and item 6's "who looked"), and a password reset link made
on the users page, through the browser: the sessions of an account (one logged out from another
browser, which then finds itself at the log-in page), the password changed, every conversation
exported and imported back, an admin's look listed, the account deleted.

The synthetic engine: the replies are not the point."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from e2e.axe import assert_accessible
from e2e.conftest import User, watch_pages
from e2e.helpers import csrf_headers
from tests.live_server import TEST_PASSWORD, LiveServer

NEW_PASSWORD = "a new and longer passphrase"


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture
def contexts(browser: Browser, server: LiveServer) -> Iterator[Callable[[], BrowserContext]]:
    """More browser contexts (watched for page errors), closed after the test."""
    made: list[tuple[BrowserContext, list[str]]] = []

    def make() -> BrowserContext:
        context = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 800})
        context.set_default_timeout(15_000)
        errors: list[str] = []
        watch_pages(context, errors)
        made.append((context, errors))
        return context

    yield make
    for context, _ in made:
        context.close()
    assert not [e for _, errors in made for e in errors]


def api_login(context: BrowserContext, email: str, password: str = TEST_PASSWORD) -> None:
    response = context.request.post(
        "/api/auth/login",
        data={"email": email, "password": password},
        headers=csrf_headers(context, context.request),
    )
    assert response.status == 200, response.text()


def new_conversation(context: BrowserContext, title: str) -> str:
    headers = csrf_headers(context, context.request)
    response = context.request.post("/api/conversations", data={"title": title}, headers=headers)
    assert response.status == 201, response.text()
    return response.json()["id"]


def open_account_page(page: Page) -> None:
    page.goto("/")
    page.get_by_test_id("account-link").click()
    expect(page).to_have_url(re.compile(r"/account$"))
    expect(page.get_by_role("heading", name="Your account", exact=True)).to_be_visible()


def test_sessions_are_listed_and_another_browser_logged_out(
    new_user: Callable[..., User], contexts: Callable[[], BrowserContext], server: LiveServer
) -> None:
    user = new_user("sessions")
    other = contexts()
    api_login(other, user.email)
    other_page = other.new_page()
    other_page.goto("/")
    expect(other_page.locator("#app")).to_have_attribute("data-ready", "true")

    page = user.page
    open_account_page(page)
    rows = page.get_by_test_id("session-row")
    expect(rows).to_have_count(2)
    expect(page.locator("[data-testid=session-row][data-current=true]")).to_contain_text(
        "this browser"
    )
    page.get_by_test_id("end-session").click()
    expect(rows).to_have_count(1)
    expect(page.get_by_test_id("end-others")).to_be_disabled()

    other_page.goto("/")  # its next request finds it logged out
    expect(other_page).to_have_url(f"{server.url}/login")


def test_the_password_is_changed_and_the_other_sessions_end(
    new_user: Callable[..., User], contexts: Callable[[], BrowserContext], server: LiveServer
) -> None:
    user = new_user("password")
    other = contexts()
    api_login(other, user.email)
    page = user.page
    open_account_page(page)
    expect(page.get_by_test_id("session-row")).to_have_count(2)

    page.get_by_test_id("current-password").fill("not my password")
    page.get_by_test_id("new-password").fill(NEW_PASSWORD)
    page.get_by_test_id("change-password").click()
    expect(page.get_by_test_id("password-error")).to_have_text("The password is wrong")
    expect(page.get_by_test_id("password-done")).to_be_hidden()

    page.get_by_test_id("current-password").fill(TEST_PASSWORD)
    page.get_by_test_id("new-password").fill(NEW_PASSWORD)
    page.get_by_test_id("change-password").click()
    expect(page.get_by_test_id("password-done")).to_be_visible()
    expect(page.get_by_test_id("password-error")).to_be_hidden()
    expect(page.get_by_test_id("session-row")).to_have_count(1)
    assert other.request.get("/api/me").status == 401
    page.get_by_test_id("back-to-chat").click()  # this browser stays logged in
    expect(page.locator("#app")).to_have_attribute("data-ready", "true")

    fresh = contexts().new_page()
    fresh.goto("/login")
    fresh.get_by_test_id("email").fill(user.email)
    fresh.get_by_test_id("password").fill(NEW_PASSWORD)
    fresh.get_by_test_id("submit").click()
    expect(fresh).to_have_url(f"{server.url}/")


def test_every_conversation_exports_in_one_file_and_imports_back(
    new_user: Callable[..., User], tmp_path: object
) -> None:
    user = new_user("export")
    for title in ("First <b>chat</b>", "Second chat"):
        new_conversation(user.context, title)
    page = user.page
    open_account_page(page)
    with page.expect_download() as download_info:
        page.get_by_test_id("export-all").click()
    download = download_info.value
    assert download.suggested_filename.startswith("conversations-")
    path = download.path()
    bundle = json.loads(open(path, encoding="utf-8").read())
    assert bundle["format"] == "streamchat.conversations"
    titles = [c["conversation"]["title"] for c in bundle["conversations"]]
    assert titles == ["First <b>chat</b>", "Second chat"]

    page.get_by_test_id("import-all-file").set_input_files(path)
    expect(page.get_by_test_id("import-done")).to_have_text("Imported 2 conversations.")
    listed = user.context.request.get("/api/conversations").json()
    assert len(listed) == 4
    page.goto("/")
    expect(page.get_by_test_id("conversation")).to_have_count(4)
    expect(page.get_by_text("First <b>chat</b>").first).to_be_visible()  # inert text, not markup


def test_the_user_sees_the_admin_who_opened_their_conversation(
    new_user: Callable[..., User], admin: User
) -> None:
    user = new_user("watched")
    conversation = new_conversation(user.context, "Watched chat")
    page = user.page
    open_account_page(page)
    expect(page.get_by_test_id("looks-empty")).to_be_visible()

    admin_page = admin.page
    admin_page.goto(f"/admin/conversations/{conversation}")
    page.reload()
    row = page.get_by_test_id("look-row")
    expect(row).to_have_count(1)
    expect(row.get_by_test_id("look-admin")).to_have_text(admin.email)
    expect(row.get_by_test_id("look-conversation")).to_have_text("Watched chat")
    expect(row).to_contain_text("opened")
    expect(page.get_by_test_id("looks-empty")).to_be_hidden()


def test_the_account_is_deleted_with_the_password(
    new_user: Callable[..., User], server: LiveServer
) -> None:
    user = new_user("leaver")
    new_conversation(user.context, "Soon gone")
    page = user.page
    open_account_page(page)
    page.get_by_test_id("delete-password").fill("not my password")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("delete-account").click()
    expect(page.get_by_test_id("delete-error")).to_have_text("The password is wrong")

    page.get_by_test_id("delete-password").fill(TEST_PASSWORD)
    page.once("dialog", lambda dialog: dialog.dismiss())  # "cancel": nothing happens
    page.get_by_test_id("delete-account").click()
    expect(page).to_have_url(f"{server.url}/account")
    assert user.context.request.get("/api/me").status == 200

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("delete-account").click()
    expect(page).to_have_url(f"{server.url}/login")
    assert user.context.request.get("/api/me").status == 401
    page.get_by_test_id("email").fill(user.email)
    page.get_by_test_id("password").fill(TEST_PASSWORD)
    page.get_by_test_id("submit").click()
    expect(page.get_by_test_id("auth-error")).to_have_text("Wrong email or password.")


def test_a_reset_link_from_the_users_page_sets_a_new_password(
    new_user: Callable[..., User],
    admin: User,
    contexts: Callable[[], BrowserContext],
    server: LiveServer,
) -> None:
    user = new_user("forgetful")
    admin_page = admin.page
    admin_page.goto(f"/admin/users?q={user.email}")
    row = admin_page.locator(f"[data-testid=admin-user][data-email='{user.email}']")
    row.get_by_test_id("user-reset-link").click()
    link = admin_page.get_by_test_id("link-value").input_value()
    assert link.startswith(f"{server.url}/reset#token="), link

    page = contexts().new_page()
    page.goto(link)
    page.get_by_test_id("password").fill(NEW_PASSWORD)
    page.get_by_test_id("submit").click()
    expect(page.get_by_test_id("reset-done")).to_be_visible()
    assert "token" not in page.url  # the spent secret leaves the address bar
    assert user.context.request.get("/api/me").status == 401  # their sessions ended

    again = contexts().new_page()  # once only
    again.goto(link)
    again.get_by_test_id("password").fill("yet another passphrase")
    again.get_by_test_id("submit").click()
    expect(again.get_by_test_id("auth-error")).to_be_visible()

    page.get_by_role("link", name="Log in").click()
    page.get_by_test_id("email").fill(user.email)
    page.get_by_test_id("password").fill(NEW_PASSWORD)
    page.get_by_test_id("submit").click()
    expect(page).to_have_url(f"{server.url}/")
    expect(page.locator("#app")).to_have_attribute("data-user-email", user.email)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_account_page_is_accessible(
    new_user: Callable[..., User],
    admin: User,
    contexts: Callable[[], BrowserContext],
    theme: str,
) -> None:
    user = new_user("a11y-account")
    api_login(contexts(), user.email)  # a second session, with its "Log out" button
    conversation = new_conversation(user.context, "Looked at")
    admin.page.goto(f"/admin/conversations/{conversation}")
    page = user.page
    page.emulate_media(color_scheme=theme)
    open_account_page(page)
    expect(page.get_by_test_id("session-row")).to_have_count(2)
    expect(page.get_by_test_id("look-row")).to_have_count(1)
    page.get_by_test_id("change-password").click()  # an error shown too
    expect(page.get_by_test_id("password-error")).to_be_visible()
    assert_accessible(page, f"/account ({theme})")
    page.set_viewport_size({"width": 390, "height": 800})
    assert_accessible(page, f"/account, phone ({theme})")
