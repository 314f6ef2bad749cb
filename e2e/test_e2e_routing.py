"""The chat page's fragment routing (`/#<conversation id>`) in Chromium, with fragments that are
not valid percent-encoding: `decodeURIComponent` throws a URIError on them, which must not break
the page (static/js/route.js)."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import expect

from e2e.conftest import User
from e2e.helpers import csrf_headers

BROKEN_FRAGMENT = "%E0%A4%A"  # a cut-short "%E0%A4%A4" (Devanagari "त")


def test_a_broken_fragment_opens_the_latest_conversation_without_errors(
    new_user: Callable[..., User],
) -> None:
    """Loading `/#%E0%A4%A` shows the page ready with the latest conversation open (the fragment
    names none); changing the fragment to a broken one later keeps that conversation open. No
    uncaught error in the page either time."""
    user = new_user()
    request = user.context.request
    response = request.post(
        "/api/conversations",
        data={"title": "Routing"},
        headers=csrf_headers(user.context, request),
    )
    assert response.status == 201, response.text()
    conversation_id = response.json()["id"]
    page = user.page

    page.goto(f"/#{BROKEN_FRAGMENT}")
    expect(page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
    assert user.page_errors == []
    expect(page.locator("#conv-title")).to_have_text("Routing")
    assert page.evaluate("location.hash") == f"#{conversation_id}"

    # Listeners run in the order they were added: once this one has, the page's own has too.
    page.evaluate(
        """(hash) => new Promise((resolve) => {
            window.addEventListener("hashchange", () => resolve(), { once: true });
            location.hash = hash;
        })""",
        BROKEN_FRAGMENT,
    )
    assert page.evaluate("location.hash") == f"#{BROKEN_FRAGMENT}"
    assert user.page_errors == []
    expect(page.locator("#conv-title")).to_have_text("Routing")
