"""SIGNUP_MODE=approval through the browser (issue 24 item 1): a new sign-up sees the page that says
it waits for an admin, everywhere it goes, until an admin approves it on the users page in another
browser; the waiting page then goes on to the chat by itself.

The synthetic engine: the replies are not the point."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, expect

from e2e.conftest import User, watch_pages
from e2e.helpers import unique_email
from tests.live_server import TEST_PASSWORD, LiveServer

WAITING_POLL_S = 5  # static/js/waiting.js asks every 5 s


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SIGNUP_MODE": "approval"}


def test_a_new_sign_up_waits_until_an_admin_approves_it(
    browser: Browser, server: LiveServer, admin: User
) -> None:
    context = browser.new_context(base_url=server.url)
    context.set_default_timeout(15_000)
    errors: list[str] = []
    watch_pages(context, errors)
    try:
        page = context.new_page()
        email = unique_email("waiting")
        page.goto("/signup")
        expect(page.get_by_test_id("signup-notice")).to_contain_text("An admin approves")
        page.get_by_test_id("email").fill(email)
        page.get_by_test_id("password").fill(TEST_PASSWORD)
        page.get_by_test_id("submit").click()
        expect(page).to_have_url(f"{server.url}/")
        expect(page.get_by_test_id("waiting")).to_be_visible()
        expect(page.locator("#app")).to_have_count(0)
        # Nothing else opens to it: the API says 401, the account page sends it back.
        assert context.request.get("/api/me").status == 401
        assert context.request.get("/api/conversations").status == 401
        page.goto("/account")
        expect(page).to_have_url(f"{server.url}/")
        expect(page.get_by_test_id("waiting")).to_be_visible()

        # The admin finds it among the pending accounts and approves it.
        admin_page = admin.page
        admin_page.goto("/admin/users?state=pending")
        row = admin_page.locator(f"[data-testid=admin-user][data-email='{email}']")
        expect(row.get_by_test_id("user-state")).to_have_text("pending")
        row.get_by_test_id("user-approve").click()
        expect(row.get_by_test_id("user-approve")).to_have_count(0)  # answered: no longer pending
        admin_page.goto(f"/admin/users?q={email}")
        expect(admin_page.get_by_test_id("user-state")).to_have_text("active")

        # The waiting page notices by itself and goes on to the chat.
        expect(page.locator("#app")).to_have_attribute(
            "data-ready", "true", timeout=(WAITING_POLL_S * 2 + 5) * 1000
        )
        expect(page.locator("#app")).to_have_attribute("data-user-email", email)
        assert context.request.get("/api/me").status == 200
    finally:
        context.close()
    assert not errors, errors


def test_the_waiting_page_logs_out(browser: Browser, server: LiveServer, admin: User) -> None:
    context = browser.new_context(base_url=server.url)
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.goto("/signup")
        page.get_by_test_id("email").fill(unique_email("leaving"))
        page.get_by_test_id("password").fill(TEST_PASSWORD)
        page.get_by_test_id("submit").click()
        expect(page.get_by_test_id("waiting")).to_be_visible()
        page.get_by_test_id("logout").click()
        expect(page).to_have_url(re.compile(r"/login$"))
        page.goto("/")
        expect(page).to_have_url(re.compile(r"/login$"))
    finally:
        context.close()
