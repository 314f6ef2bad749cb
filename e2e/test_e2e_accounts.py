"""Sign-up, log-in and log-out through the pages, and an API key made in the page and used with
the `openai` package against the real model."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from playwright.sync_api import Browser, expect

from e2e.conftest import User, watch_pages
from e2e.helpers import ChatPage, unique_email, wait_engine_idle
from tests.live_server import TEST_PASSWORD, LiveServer


def test_sign_up_log_out_log_in_through_the_pages(
    browser: Browser, server: LiveServer, admin: User
) -> None:
    context = browser.new_context(base_url=server.url)
    errors: list[str] = []
    watch_pages(context, errors)
    try:
        page = context.new_page()
        email = unique_email("signup")

        # Logged out, the chat sends to the log-in page, which links to sign-up.
        page.goto("/")
        expect(page).to_have_url(f"{server.url}/login")
        page.get_by_test_id("signup-link").click()
        expect(page).to_have_url(f"{server.url}/signup")
        page.get_by_test_id("email").fill(email)
        page.get_by_test_id("password").fill(TEST_PASSWORD)
        page.get_by_test_id("submit").click()
        expect(page).to_have_url(f"{server.url}/")
        expect(page.locator("#app")).to_have_attribute("data-ready", "true")
        expect(page.locator("#app")).to_have_attribute("data-user-email", email)
        expect(page.get_by_test_id("admin-link")).to_have_count(0)  # the admin came first

        # The same email again: refused, with a message.
        other = context.new_page()
        other.goto("/signup")
        other.get_by_test_id("email").fill(email)
        other.get_by_test_id("password").fill(TEST_PASSWORD)
        other.get_by_test_id("submit").click()
        expect(other.get_by_test_id("auth-error")).to_contain_text("already exists")
        other.close()

        page.get_by_test_id("logout").click()
        expect(page).to_have_url(f"{server.url}/login")
        assert context.request.get("/api/me").status == 401
        page.goto("/")
        expect(page).to_have_url(f"{server.url}/login")

        # A wrong password is refused; the right one logs in and returns to the chat.
        page.get_by_test_id("email").fill(email)
        page.get_by_test_id("password").fill("not the password")
        page.get_by_test_id("submit").click()
        expect(page.get_by_test_id("auth-error")).to_have_text("Wrong email or password.")
        expect(page).to_have_url(f"{server.url}/login")
        page.get_by_test_id("password").fill(TEST_PASSWORD)
        page.get_by_test_id("submit").click()
        expect(page).to_have_url(f"{server.url}/")
        expect(page.locator("#app")).to_have_attribute("data-user-email", email)
        assert context.request.get("/api/me").json()["email"] == email
    finally:
        context.close()
    assert not errors, errors


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_api_key_made_in_the_page_works_with_the_openai_client(
    new_user: Callable[..., User], admin: User, server: LiveServer, stream: bool
) -> None:
    user = new_user("keys")
    chat = ChatPage(user.page).open()
    page = chat.page
    page.get_by_test_id("account").click()
    keys = page.get_by_test_id("api-keys")
    expect(keys).to_be_visible()
    expect(keys.get_by_test_id("key-item")).to_have_count(0)
    page.get_by_test_id("key-name").fill("e2e script")
    page.get_by_test_id("create-key").click()
    secret_el = page.get_by_test_id("new-key-secret")
    expect(secret_el).to_be_visible()
    secret = (secret_el.text_content() or "").strip()
    assert len(secret) >= 20, secret
    item = keys.get_by_test_id("key-item")
    expect(item).to_have_count(1)
    expect(item).to_contain_text("e2e script")
    assert secret not in (item.text_content() or ""), "the key list shows the whole secret"

    # Shown once: closing the dialog wipes it, reopening (or reloading) does not bring it back.
    page.keyboard.press("Escape")
    expect(page.locator("#account-dialog")).not_to_be_visible()
    expect(secret_el).to_be_empty()
    assert secret not in page.content()
    chat.reload()
    page.get_by_test_id("account").click()
    expect(keys.get_by_test_id("key-item")).to_have_count(1)
    expect(page.get_by_test_id("new-key")).to_be_hidden()
    assert secret not in page.content()

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=secret, max_retries=0)
    models = client.models.list().data
    assert models, "GET /v1/models listed no model"
    model = models[0].id
    messages = [{"role": "user", "content": "Say hello."}]
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=model, messages=messages, max_tokens=16, stream=True
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    else:
        completion = client.chat.completions.create(model=model, messages=messages, max_tokens=16)
        text = completion.choices[0].message.content or ""
        finish = completion.choices[0].finish_reason
        assert completion.model == model
        assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 16
    assert text.strip(), "the model said nothing"
    assert finish in ("stop", "length"), finish

    # The key's use shows in the page; revoked in the page, it stops working.
    chat.reload()
    page.get_by_test_id("account").click()
    expect(keys.get_by_test_id("key-item")).not_to_contain_text("never used")
    keys.get_by_test_id("revoke-key").click()
    expect(keys.get_by_test_id("key-item")).to_have_count(0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    wait_engine_idle(admin.context.request)
