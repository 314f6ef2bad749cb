"""Who sees what (the admin console vs an ordinary user) and script/HTML payloads rendered as text.

Payloads reach the page three ways, and each is checked to render as text and run nothing
(`window.__pwned` stays undefined, no <img>/<script>/<svg>/... or on* attribute appears inside the
message list, and the browser never requests the payload's `src=x`):

- typed by the user: shown while the reply streams, then again from the database after a reload,
  in the sidebar and the title, and in the admin console;
- written by the model, live: the real SmolLM2 will not reliably echo markup, so the test asks it
  to ("Repeat exactly: ...") and then puts the payload into the reply's stream on its way to the
  page (a Playwright route for SSE, a WebSocket route for WS) in place of the model's own deltas:
  the page's transport, stream and Markdown code handle it exactly as a model delta;
- written by the model, stored: the reply's row is overwritten in the database with a payload
  (raw HTML and Markdown link/image tricks), and the page (after a reload) and the admin console
  render it from there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Page, Request, Route, WebSocketRoute, expect

from app.domain.chat.conversations.store import title_from_message
from e2e.conftest import User, watch_pages
from e2e.helpers import (
    SHORT,
    ChatPage,
    api_json,
    csrf_headers,
    db_message,
    db_set_content,
    parse_sse,
    screenshot,
    sse_body,
    wait_engine_idle,
    wait_until,
)
from tests.live_server import TEST_PASSWORD, LiveServer

IMG = '<img src=x onerror="window.__pwned=1">'
SCRIPT = "<script>window.__pwned=2</script>"
USER_PAYLOAD = f"Repeat exactly: {IMG} {SCRIPT}"
# The chat's title, made from the first message by the server's rule (cut at a word, with "…").
USER_TITLE = title_from_message(USER_PAYLOAD)
REPLY_PAYLOAD = (
    f"Sure: {IMG}\n\n{SCRIPT}\n\n"
    '<svg onload="window.__pwned=3"></svg> <iframe src="javascript:window.__pwned=4"></iframe>\n\n'
    "[click me](javascript:window.__pwned=5) ![pic](x) <a href=javascript:window.__pwned=6>a</a>\n\n"
    "```html\n<script>window.__pwned=7</script>\n```"
)


# Where user and model text is shown: the messages, the conversation's title and link, and the
# admin console's titles and message texts (the page's own icons live elsewhere).
CONTENT = ", ".join(
    [
        "[data-testid=messages]",
        "[data-testid=conversation-link]",
        "[data-testid=conversation-title]",
        "[data-testid=admin-conversations] tbody",
        ".admin-content",
        ".admin-main h1",
    ]
)
# The page's own controls inside the message list (built by the page, never from user or model
# text): their icons and inputs are not injected markup. Only outside the rendered text, though:
# markup that slipped through markdown.js would sit inside a [data-testid=message-text].
OWN_CONTROLS = ", ".join(
    ["[data-testid=rating]", "[data-testid=branch-switcher]", "[data-testid=edit-input]"]
)
RENDERED_TEXT = "[data-testid=message-text]"


def assert_nothing_ran(page: Page, requested: list[str], where: str) -> None:
    state = page.evaluate(
        """([where, own, text]) => {
          const areas = [...document.querySelectorAll(where)];
          const ours = (e) => !e.closest(text) && e.closest(own) !== null;
          const inside = (selector) =>
            areas.flatMap((a) => [...a.querySelectorAll(selector)]).filter((e) => !ours(e));
          return {
            areas: areas.length > 0,
            pwned: window.__pwned === undefined ? null : String(window.__pwned),
            injected: inside(
              "img, script, iframe, svg, object, embed, style, link, meta, base, form, input, " +
                "textarea"
            ).map((e) => e.outerHTML),
            handlers: [...document.querySelectorAll("*")].flatMap((e) =>
              [...e.attributes].filter((a) => a.name.startsWith("on")).map(() => e.outerHTML)),
            hrefs: inside("[href], [src]")
              .map((e) => e.getAttribute("href") ?? e.getAttribute("src"))
              .filter((h) => !/^(https?:\\/\\/|\\/(?!\\/)|#)/.test(h)),
          };
        }""",
        [CONTENT, OWN_CONTROLS, RENDERED_TEXT],
    )
    assert state == {"areas": True, "pwned": None, "injected": [], "handlers": [], "hrefs": []}, (
        where,
        state,
    )
    assert not requested, f"{where}: the payload's src was requested: {requested}"


def watch_payload_requests(page: Page) -> list[str]:
    """URLs the page requests for the payload's `src=x` (there must be none)."""
    requested: list[str] = []

    def on_request(request: Request) -> None:
        if request.url.rstrip("/").endswith("/x") or request.url.startswith("javascript:"):
            requested.append(request.url)

    page.on("request", on_request)
    return requested


# -- the admin console and isolation between users ------------------------------------------------


def test_admin_sees_another_users_conversation_and_others_see_nothing(
    new_user: Callable[..., User], admin: User, server: LiveServer, browser: Any
) -> None:
    bob, carol = new_user("bob"), new_user("carol")
    bob_chat = ChatPage(bob.page).open()
    expect(bob.page.get_by_test_id("admin-link")).to_have_count(0)
    reply = bob_chat.send(SHORT)
    assert bob_chat.wait_done(reply) in ("completed", "length")
    bob_conversation = bob_chat.conversation_id()
    bob_reply = bob_chat.stored(reply)

    # The admin: the conversation is listed with its owner, and opens in full.
    page = admin.page
    page.goto("/")
    expect(page.get_by_test_id("admin-link")).to_be_visible()
    page.get_by_test_id("admin-link").click()
    expect(page).to_have_url(f"{server.url}/admin")
    row = page.locator(
        f"[data-testid=admin-conversation][data-conversation-id='{bob_conversation}']"
    )
    expect(row).to_contain_text(bob.email)
    expect(row).to_contain_text(SHORT)
    expect(row.get_by_test_id("status")).to_have_text(bob_reply["status"])
    screenshot(page, "admin-console")
    row.get_by_role("link").click()
    expect(page).to_have_url(f"{server.url}/admin/conversations/{bob_conversation}")
    expect(page.locator(".facts").first).to_contain_text(bob.email)
    messages = page.get_by_test_id("admin-message")
    expect(messages).to_have_count(2)
    expect(messages.nth(0)).to_have_attribute("data-role", "user")
    assert messages.nth(0).locator(".admin-content").text_content() == SHORT
    assistant = messages.nth(1)
    expect(assistant).to_have_attribute("data-message-id", bob_reply["id"])
    expect(assistant).to_have_attribute("data-status", bob_reply["status"])
    assert assistant.locator(".admin-content").text_content() == bob_reply["content"]
    screenshot(page, "admin-conversation")
    for path in ("/admin/live", "/admin/charts"):
        assert page.goto(path).status == 200, path
    assert (
        api_json(admin.context.request, f"/admin/api/messages/{bob_reply['id']}")["content"]
        == (bob_reply["content"])
    )

    # An ordinary user: no admin pages or admin API, and nobody else's conversation or reply.
    for path in ("/admin", f"/admin/conversations/{bob_conversation}", "/admin/live"):
        response = carol.page.goto(path)
        assert response is not None and response.status == 403, (path, response and response.status)
    for path in ("/admin/api/engine", f"/admin/api/messages/{bob_reply['id']}"):
        assert carol.context.request.get(path).status == 403, path
    request = carol.context.request
    assert request.get(f"/api/conversations/{bob_conversation}").status == 404
    assert request.get(f"/api/messages/{bob_reply['id']}/stream").status == 404
    cancel = request.post(
        f"/api/messages/{bob_reply['id']}/cancel", headers=csrf_headers(carol.context, request)
    )
    assert cancel.status == 404
    assert api_json(request, "/api/conversations") == []
    # Bob's conversation id in Carol's address bar shows her nothing of his.
    carol_chat = ChatPage(carol.page)
    carol.page.goto(f"/#{bob_conversation}")
    expect(carol.page.locator("#app")).to_have_attribute("data-ready", "true")
    expect(carol_chat.page.get_by_test_id("message")).to_have_count(0)
    expect(carol.page.get_by_test_id("messages")).not_to_contain_text(bob_reply["content"][:20])

    # Nobody logged in: 401 from the admin pages and API, and the chat sends to the log-in page.
    anonymous = browser.new_context(base_url=server.url)
    try:
        assert anonymous.request.get("/admin").status == 401
        assert anonymous.request.get("/admin/api/engine").status == 401
        assert anonymous.request.get(f"/api/conversations/{bob_conversation}").status == 401
    finally:
        anonymous.close()
    wait_engine_idle(admin.context.request)


# -- payloads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_html_in_the_users_message_renders_as_text(
    new_user: Callable[..., User], admin: User, transport: str
) -> None:
    user = new_user()
    requested = watch_payload_requests(user.page)
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)
    reply = chat.send(USER_PAYLOAD)
    mine = chat.user_messages().last.get_by_test_id("message-text")
    assert mine.text_content() == USER_PAYLOAD
    assert_nothing_ran(chat.page, requested, "while the reply streams")
    chat.wait_done(reply)
    stored = chat.stored(reply)
    chat.assert_screen_is(reply, stored["content"])
    echoed = "<img" in stored["content"] or "<script" in stored["content"]
    print(f"the model echoed markup: {echoed}; its reply: {stored['content']!r}")
    assert_nothing_ran(chat.page, requested, "after the reply")

    chat.reload()
    assert chat.user_messages().last.get_by_test_id("message-text").text_content() == USER_PAYLOAD
    chat.assert_screen_is(chat.assistant_messages().last, stored["content"])
    expect(chat.page.get_by_test_id("conversation-title")).to_have_text(USER_TITLE)
    expect(chat.page.get_by_test_id("conversation-link")).to_have_text(USER_TITLE)
    assert_nothing_ran(chat.page, requested, "after a reload")

    # The admin console renders the same words as text.
    conversation_id = chat.conversation_id()
    admin_requests = watch_payload_requests(admin.page)
    admin.page.goto(f"/admin?q={quote(USER_PAYLOAD[:20])}")
    row = admin.page.locator(f"[data-conversation-id='{conversation_id}']")
    expect(row.get_by_role("link")).to_have_text(USER_TITLE)
    assert_nothing_ran(admin.page, admin_requests, "admin list")
    admin.page.goto(f"/admin/conversations/{conversation_id}")
    content = admin.page.get_by_test_id("admin-message").first.locator(".admin-content")
    assert content.text_content() == USER_PAYLOAD
    assert_nothing_ran(admin.page, admin_requests, "admin conversation")


def inject_into_sse(page: Page, payload: str) -> None:
    """Replace the model's deltas in the page's SSE stream by one delta carrying `payload`
    (the message is still sent to the real server, with a small max_tokens)."""

    def handle(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        body = json.loads(route.request.post_data or "{}")
        response = route.fetch(post_data=json.dumps({**body, "max_tokens": 8}))
        events = parse_sse(response.text())
        start = [e for e in events if e[0] == "start"]
        end = [e for e in events if e[0] in ("final", "error")]
        assert start and end, events
        message_id = start[0][2]["message_id"]
        delta = ("delta", len(payload), {"message_id": message_id, "text": payload})
        route.fulfill(
            status=response.status,
            headers=response.headers,
            body=sse_body([start[0], delta, end[0]]),
        )

    page.route("**/api/conversations/*/messages", handle)


def inject_into_ws(page: Page, payload: str) -> None:
    """The same for the page's WebSocket: the real server's frames pass through, except that the
    model's deltas are replaced by one delta carrying `payload`."""

    def handle(ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()
        injected: set[str] = set()

        def to_server(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "send":
                frame["max_tokens"] = 8
            server.send(json.dumps(frame))

        def to_page(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "delta":
                if frame["message_id"] in injected:
                    return
                injected.add(frame["message_id"])
                frame.update(id=len(payload), text=payload)
            ws.send(json.dumps(frame))

        ws.on_message(to_server)
        server.on_message(to_page)

    page.route_web_socket("**/ws", handle)


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_html_in_a_model_reply_renders_as_text(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    user = new_user()
    requested = watch_payload_requests(user.page)
    (inject_into_ws if transport == "ws" else inject_into_sse)(user.page, REPLY_PAYLOAD)
    chat = ChatPage(user.page).open()
    chat.use_transport(transport)

    # Live: the payload arrives as the reply's text, over the page's real stream code.
    reply = chat.send("Say OK.")
    chat.wait_done(reply)
    assert chat.raw_text(reply) == REPLY_PAYLOAD
    text = reply.get_by_test_id("message-text")
    for fragment in (IMG, SCRIPT, '<svg onload="window.__pwned=3"></svg>'):
        expect(text).to_contain_text(fragment)
    expect(text.locator("pre code")).to_have_text("<script>window.__pwned=7</script>")
    assert_nothing_ran(chat.page, requested, "live reply")

    # Stored: the same payload as the reply's row in the database, rendered after a reload.
    message_id = reply.get_attribute("data-message-id")
    assert message_id
    db_set_content(database_url, message_id, REPLY_PAYLOAD)
    assert db_message(database_url, message_id)["content"] == REPLY_PAYLOAD
    chat.reload()
    stored_reply = chat.assistant_messages().last
    expect(stored_reply).to_have_attribute("data-message-id", message_id)
    chat.assert_screen_is(stored_reply, REPLY_PAYLOAD)
    expect(stored_reply.get_by_test_id("message-text")).to_contain_text(IMG)
    assert_nothing_ran(chat.page, requested, "stored reply after a reload")

    admin_requests = watch_payload_requests(admin.page)
    admin.page.goto(f"/admin/conversations/{chat.conversation_id()}")
    content = admin.page.get_by_test_id("admin-message").nth(1).locator(".admin-content")
    assert content.text_content() == REPLY_PAYLOAD
    assert_nothing_ran(admin.page, admin_requests, "admin conversation")
    wait_engine_idle(admin.context.request)


# -- open redirects after log-in (issue 9, item 4) -------------------------------------------------

# `?next=` values a browser resolves to another site: tab/newline/CR are dropped by the URL
# parser and a backslash is a slash, so "/\t/evil.example" is "//evil.example".
OFFSITE_NEXT = [
    "/%09/evil.example/phish",
    "/%0A/evil.example/phish",
    "/%0D%5C%5Cevil.example/phish",
    "//evil.example/phish",
    "/%5Cevil.example/phish",
    "https://evil.example/phish",
    "/x/..//evil.example/phish",
    "javascript:window.__pwned=1",
]


def test_log_in_goes_to_next_only_on_this_site(
    browser: Any, server: LiveServer, new_user: Callable[..., User]
) -> None:
    """After log-in, no `next` takes the browser off this site (evil.example is stubbed, so a wrong
    redirect is seen, not just a DNS error), and a path on this site is honoured. (Checked: before
    the fix the first three went to evil.example.)"""
    email = new_user("redirect").email
    context = browser.new_context(base_url=server.url)
    errors: list[str] = []
    watch_pages(context, errors)
    offsite: list[str] = []

    def stub(route: Route) -> None:
        offsite.append(route.request.url)
        route.fulfill(status=200, content_type="text/html", body="<h1>phished</h1>")

    context.route(re.compile(r"^[a-z]+://evil\.example"), stub)
    page = context.new_page()

    def log_in_with_next(next_: str) -> str:
        page.goto(f"/login?next={next_}")
        page.get_by_test_id("email").fill(email)
        page.get_by_test_id("password").fill(TEST_PASSWORD)
        page.get_by_test_id("submit").click()
        expect(page).not_to_have_url(re.compile(r"/login\?"))
        return page.url

    try:
        for next_ in OFFSITE_NEXT:
            landed = log_in_with_next(next_)
            assert offsite == [], (next_, offsite)
            assert landed.startswith(f"{server.url}/"), (next_, landed)
            assert page.evaluate("window.__pwned") is None, next_
        assert log_in_with_next(quote("/?from=login", safe="")) == f"{server.url}/?from=login"
    finally:
        context.close()
    assert errors == []


# -- the Content-Security-Policy (issue 9, item 6) ------------------------------------------------


def test_the_pages_pass_the_content_security_policy_which_blocks_inline_code(
    new_user: Callable[..., User], admin: User, server: LiveServer, browser: Any
) -> None:
    """The chat, log-in, sign-up and admin pages run under the policy with no violation (the
    `new_user` fixture fails the test on any), and the policy is really enforced: an injected
    inline script does not run and is reported, and no other site may frame a page."""
    user = new_user("csp")
    chat = ChatPage(user.page).open()
    reply = chat.send(SHORT)
    chat.wait_done(reply)
    for path in ("/admin", "/admin/live", "/admin/charts"):
        response = admin.page.goto(path)
        assert response is not None and response.status == 200, path
        assert "'self'" in response.headers["content-security-policy"]
    expect(admin.page.get_by_test_id("chart-ttft").locator("svg")).to_be_visible()
    anonymous = browser.new_context(base_url=server.url)
    errors: list[str] = []
    watch_pages(anonymous, errors)
    try:
        page = anonymous.new_page()
        for path in ("/login", "/signup"):
            page.goto(path)
            expect(page.get_by_test_id("submit")).to_be_visible()
        assert errors == [], errors

        # The control: inline code is refused and the refusal reaches `errors`.
        ran = page.evaluate(
            """() => {
              const script = document.createElement("script");
              script.textContent = "window.__inline = 1";
              document.body.append(script);
              const div = document.createElement("div");
              div.innerHTML = '<img src="data:," onerror="window.__inline = 2">';
              document.body.append(div);
              return new Promise((done) => setTimeout(() => done(window.__inline ?? null), 300));
            }"""
        )
        assert ran is None
        wait_until(lambda: list(errors), lambda e: len(e) >= 2, timeout_s=5, what="CSP reports")
        assert all("script-src" in e or "Content Security Policy" in e for e in errors), errors

        # Framed by another origin (about:blank here): refused by frame-ancestors 'none'.
        framer = anonymous.new_page()
        framer.set_content(f'<iframe src="{server.url}/login"></iframe>')
        frame = framer.frame_locator("iframe")
        framer.wait_for_timeout(1000)
        expect(frame.get_by_test_id("submit")).to_have_count(0)
    finally:
        anonymous.close()
