"""SIGNUP_MODE=invite through the browser (issue 24 item 1): the sign-up page refuses without an
invitation; an admin makes a link on the users page (optionally for one email), and it signs one
account up, once.

The synthetic engine: the replies are not the point."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from e2e.conftest import User, watch_pages
from e2e.helpers import unique_email
from tests.live_server import TEST_PASSWORD, LiveServer


@pytest.fixture(scope="module")
def engine_kind() -> str:
    return "synthetic"


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"SIGNUP_MODE": "invite"}


def make_invitation(admin: User, email: str = "") -> str:
    page = admin.page
    page.goto("/admin/users")
    form = page.get_by_test_id("invite")
    if email:
        form.get_by_test_id("invite-email").fill(email)
    form.get_by_test_id("invite-submit").click()
    return page.get_by_test_id("link-value").input_value()


def sign_up(page: Page, url: str, email: str) -> None:
    page.goto(url)
    page.get_by_test_id("email").fill(email)
    page.get_by_test_id("password").fill(TEST_PASSWORD)
    page.get_by_test_id("submit").click()


def fresh(browser: Browser, server: LiveServer, errors: list[str]) -> BrowserContext:
    context = browser.new_context(base_url=server.url)
    context.set_default_timeout(15_000)
    watch_pages(context, errors)
    return context


def test_an_invitation_link_signs_one_account_up(
    browser: Browser, server: LiveServer, admin: User
) -> None:
    errors: list[str] = []
    first, second, third = (fresh(browser, server, errors) for _ in range(3))
    try:
        # Without an invitation: refused, saying why.
        page = first.new_page()
        sign_up(page, "/signup", unique_email("uninvited"))
        expect(page.get_by_test_id("auth-error")).to_be_visible()
        expect(page).to_have_url(f"{server.url}/signup")

        link = make_invitation(admin)
        assert link.startswith(f"{server.url}/signup#invite="), link
        email = unique_email("invited")
        sign_up(page, link, email)
        expect(page).to_have_url(f"{server.url}/")
        expect(page.locator("#app")).to_have_attribute("data-ready", "true")
        expect(page.locator("#app")).to_have_attribute("data-user-email", email)

        # Spent: the same link signs nobody else up.
        again = second.new_page()
        sign_up(again, link, unique_email("second"))
        expect(again.get_by_test_id("auth-error")).to_be_visible()
        assert second.request.get("/api/me").status == 401

        # A link for one email works for that email only.
        bound_to = unique_email("bound")
        bound = make_invitation(admin, bound_to)
        other = third.new_page()
        sign_up(other, bound, unique_email("not-bound"))
        expect(other.get_by_test_id("auth-error")).to_be_visible()
        other.get_by_test_id("email").fill(bound_to)
        other.get_by_test_id("submit").click()
        expect(other.locator("#app")).to_have_attribute("data-user-email", bound_to)
    finally:
        for context in (first, second, third):
            context.close()
    assert not errors, errors
