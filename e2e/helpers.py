"""Helpers for the Playwright end-to-end tests: the browser, the chat page, the API, the database.

The tests drive the real page (templates/chat.html, static/js/) in Debian's Chromium against a
live uvicorn server (tests/live_server.py) running the real SmolLM2 model.

Playwright's sync API keeps its own event loop marked as *running* on the main thread between
calls, so `asyncio.run()` (used by tests/live_server.py for databases) must run in a worker thread
while a browser is open: see `in_thread`.

How "the text on screen" is compared with the database, exactly (`assert_screen_is`):

1. the page's own copy of the reply (`MessageView.reply.text`, reached through the message
   element's `_view`), from which every render is made, equals the stored `content` byte for byte;
2. the message's rendered DOM (`innerHTML` of its `message-text`, minus the copy buttons the page
   adds to code blocks) equals what the page's own Markdown renderer (`/static/js/markdown.js`)
   makes of the stored `content`, built in the same page.

(1) says the page holds exactly the stored text; (2) says what is shown is the render of exactly
that text (a render of a shorter, longer or duplicated text differs). Comparing `textContent` with
the raw text directly would not be exact: Markdown syntax (`**`, list numbers, fences) is consumed
by the render.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import (
    APIRequestContext,
    BrowserContext,
    Locator,
    Page,
    Route,
    WebSocketRoute,
    expect,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from tests.live_server import PROJECT_ROOT, TEST_PASSWORD, SseEvent, SseReader, query

CHROMIUM_PATH = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = PROJECT_ROOT / "artifacts"

STORY = "Write a long story about a dragon."  # long; with RUNS_TO_THE_LIMIT, until max_tokens
SHORT = "Say hello in one short sentence."

T = TypeVar("T")


def unique_email(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}@example.com"


def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` in a worker thread (for `asyncio.run()` while Playwright's loop is marked running)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def db_query(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """One SQL statement against the server's database, straight through SQLAlchemy."""
    return in_thread(query, database_url, sql, **params)


def db_message(database_url: str, message_id: str) -> dict[str, Any]:
    """A message row read straight from the database (SQLite stores a UUID as 16 bytes)."""
    if database_url.startswith("sqlite"):
        where, key = "hex(id) = :id", uuid.UUID(message_id).hex.upper()
    else:
        where, key = "id = :id", message_id
    rows = db_query(database_url, f"SELECT status, content FROM messages WHERE {where}", id=key)
    assert len(rows) == 1, f"message {message_id}: {rows!r}"
    return rows[0]


def db_set_content(database_url: str, message_id: str, content: str) -> None:
    """Overwrite a stored message's text (to plant a reply the real model will not write)."""
    if database_url.startswith("sqlite"):
        where, key = "hex(id) = :id", uuid.UUID(message_id).hex.upper()
    else:
        where, key = "id = :id", message_id
    sql = f"UPDATE messages SET content = :content WHERE {where}"

    async def run() -> int:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.begin() as connection:
                result = await connection.execute(text(sql), {"id": key, "content": content})
                return result.rowcount
        finally:
            await engine.dispose()

    assert in_thread(asyncio.run, run()) == 1, f"message {message_id} not updated"


def wait_until(
    probe: Callable[[], T], check: Callable[[T], bool], *, timeout_s: float, what: str
) -> T:
    """Call `probe` until `check` accepts its value; fail with the last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout_s} s; last value: {value!r}")
        time.sleep(0.1)


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# -- the JSON API, with a browser context's cookies ----------------------------------------------


def csrf_headers(context: BrowserContext, request: APIRequestContext) -> dict[str, str]:
    """The CSRF header for writes: any GET sets the `csrftoken` cookie."""
    cookies = {c["name"]: c["value"] for c in context.cookies()}
    if "csrftoken" not in cookies:
        request.get("/healthz")
        cookies = {c["name"]: c["value"] for c in context.cookies()}
    return {"x-csrftoken": cookies["csrftoken"]}


def api_signup(context: BrowserContext, email: str, password: str = TEST_PASSWORD) -> dict:
    """Sign up (and so log in) through the API, in `context`'s cookie jar."""
    response = context.request.post(
        "/api/auth/signup",
        data={"email": email, "password": password},
        headers=csrf_headers(context, context.request),
    )
    assert response.status == 201, response.text()
    return response.json()


def api_json(request: APIRequestContext, path: str, status: int = 200) -> Any:
    response = request.get(path)
    assert response.status == status, f"GET {path}: {response.status} {response.text()}"
    return response.json()


def engine_stats(admin_request: APIRequestContext) -> dict[str, Any]:
    return api_json(admin_request, "/admin/api/engine")


def wait_engine_idle(admin_request: APIRequestContext, timeout_s: float = 10.0) -> dict[str, Any]:
    """The engine's running and waiting counts fall back to 0 (GET /admin/api/engine, as admin)."""
    return wait_until(
        lambda: engine_stats(admin_request),
        lambda s: s["running"] == 0 and s["waiting"] == 0,
        timeout_s=timeout_s,
        what="the engine is idle",
    )


# -- the chat page -----------------------------------------------------------------------------

# Installed with `ChatPage.start_sampling`: records every distinct text of the newest assistant
# message that the DOM shows while the reply streams, with the page's raw text at that moment.
SAMPLER_JS = """
() => {
  const messages = document.querySelector("[data-testid=messages]");
  const send = document.querySelector("[data-testid=send]");
  window.__samples = [];
  let last = null;
  const sample = () => {
    const all = messages.querySelectorAll("[data-testid=message][data-role=assistant]");
    const el = all[all.length - 1];
    if (!el) return;
    const text = el.querySelector("[data-testid=message-text]").textContent;
    if (text === last) return;
    last = text;
    window.__samples.push({
      t: performance.now(),
      dom: text,
      raw: el._view ? el._view.reply.text : null,
      send: send.dataset.state,
      status: el.dataset.status,
    });
  };
  window.__sampler = new MutationObserver(sample);
  window.__sampler.observe(messages, { childList: true, subtree: true, characterData: true });
}
"""

# The rendered message (copy buttons removed) vs the page's renderer applied to `content`.
RENDER_COMPARE_JS = """
async ([el, content]) => {
  const { renderMarkdown } = await import("/static/js/markdown.js");
  const strip = (node) => {
    for (const b of node.querySelectorAll("button.code-copy")) b.remove();
    for (const pre of node.querySelectorAll("pre[data-lang]")) pre.removeAttribute("data-lang");
    return node;
  };
  const shown = strip(el.querySelector("[data-testid=message-text]").cloneNode(true));
  const expected = document.createElement("div");
  expected.append(renderMarkdown(content));
  return { shown: shown.innerHTML, expected: expected.innerHTML, raw: el._view.reply.text };
}
"""


class ChatPage:
    """The chat page of one logged-in browser context."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.composer = page.get_by_test_id("composer")
        self.send_button = page.get_by_test_id("send")
        self.messages = page.get_by_test_id("messages")

    def open(self) -> ChatPage:
        self.page.goto("/")
        expect(self.page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
        return self

    def reload(self) -> ChatPage:
        self.page.reload()
        expect(self.page.locator("#app")).to_have_attribute("data-ready", "true", timeout=15_000)
        return self

    def use_transport(self, transport: str) -> None:
        self.page.get_by_test_id("transport").select_option(transport)
        expect(self.page.get_by_test_id("transport")).to_have_value(transport)

    def new_chat(self) -> None:
        self.page.get_by_test_id("new-chat").click()

    def send(self, text: str) -> Locator:
        """Type and send a message; returns the new assistant message once it streams."""
        before = self.assistant_messages().count()
        self.composer.fill(text)
        self.send_button.click()
        reply = self.assistant_messages().nth(before)
        expect(reply).to_have_attribute("data-status", "streaming")
        expect(self.send_button).to_have_attribute("data-state", "streaming")
        return reply

    def assistant_messages(self) -> Locator:
        return self.page.locator("[data-testid=message][data-role=assistant]")

    def user_messages(self) -> Locator:
        return self.page.locator("[data-testid=message][data-role=user]")

    def wait_text(self, reply: Locator, min_chars: int, timeout_s: float = 30.0) -> str:
        """Wait until the streaming reply shows at least `min_chars` characters."""
        reply.locator("[data-testid=message-text]").filter(
            has_text=re.compile(rf"[\s\S]{{{min_chars},}}")
        ).wait_for(timeout=timeout_s * 1000)
        return self.raw_text(reply)

    def wait_done(self, reply: Locator, timeout_s: float = 60.0) -> str:
        """Wait for the reply's end state (the Send button comes back); returns data-status."""
        expect(reply).not_to_have_attribute("data-status", "streaming", timeout=timeout_s * 1000)
        expect(self.send_button).to_have_attribute("data-state", "idle")
        return reply.get_attribute("data-status") or ""

    def raw_text(self, reply: Locator) -> str:
        """The page's own copy of the reply text (what it renders from)."""
        return reply.evaluate("el => el._view.reply.text")

    def conversation_id(self) -> str:
        conversation_id = self.page.evaluate("location.hash.slice(1)")
        assert re.fullmatch(r"[0-9a-f-]{36}", conversation_id), conversation_id
        return conversation_id

    def stored_messages(self, conversation_id: str | None = None) -> list[dict[str, Any]]:
        """GET /api/conversations/{id} with this page's session."""
        conversation_id = conversation_id or self.conversation_id()
        return api_json(self.page.request, f"/api/conversations/{conversation_id}")["messages"]

    def stored(self, reply: Locator) -> dict[str, Any]:
        message_id = reply.get_attribute("data-message-id")
        assert message_id, "the reply has no data-message-id"
        rows = [m for m in self.stored_messages() if m["id"] == message_id]
        assert len(rows) == 1, f"message {message_id} not found once in {rows!r}"
        return rows[0]

    def assert_screen_is(self, reply: Locator, content: str) -> None:
        """What the page shows for `reply` is exactly `content` (see the module docstring)."""
        result = self.page.evaluate(RENDER_COMPARE_JS, [reply.element_handle(), content])
        assert result["raw"] == content, (
            f"the page's text differs from the stored text:\npage:   {result['raw']!r}\n"
            f"stored: {content!r}"
        )
        assert result["shown"] == result["expected"], (
            f"the rendered message is not the render of the stored text:\n"
            f"shown:    {result['shown']!r}\nexpected: {result['expected']!r}"
        )

    def badge(self, reply: Locator) -> Locator:
        return reply.get_by_test_id("badge")

    # -- sampling the DOM while a reply streams -----------------------------------------------

    def start_sampling(self) -> None:
        self.page.evaluate(SAMPLER_JS)

    def samples(self) -> list[dict[str, Any]]:
        return self.page.evaluate("window.__sampler.takeRecords(), window.__samples")


# Greedy with the repeat penalty off: SmolLM2 settles into a loop on STORY and runs to max_tokens.
# The chat's default penalty (1.1, app/domain/chat/replies/limits.py) ends greedy STORY at ~590 tokens,
# which once finished a reply a test meant to Stop before the test got there.
RUNS_TO_THE_LIMIT = {"temperature": 0, "repeat_penalty": 1.0}


def ask_for_longer_replies(
    page: Page, max_tokens: int | Mapping[str, int], only: str | None = None
) -> None:
    """Sends from this page (those of the message `only`, if given; or, with a mapping, those of
    its messages, each with its own length) ask the real server for `max_tokens`, greedy with no
    repeat penalty, over SSE or the WebSocket, instead of the e2e server's small default and
    sampling: a test whose reply must outlast something (an outage, a reload, a Stop on its way)
    or reach its limit must not depend on how fast this machine decodes, nor on a sampled reply
    ending early (RUNS_TO_THE_LIMIT). Responses pass through untouched, still streaming."""

    def longer(content: object) -> dict[str, Any] | None:
        if isinstance(max_tokens, Mapping):
            limit = max_tokens.get(content) if isinstance(content, str) else None
        else:
            limit = max_tokens if only is None or content == only else None
        return None if limit is None else {"max_tokens": limit, **RUNS_TO_THE_LIMIT}

    def sse(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}") if route.request.method == "POST" else {}
        params = longer(body.get("content"))
        if params is None:
            route.continue_()
            return
        route.continue_(post_data=json.dumps({**body, **params}))

    def ws(route: WebSocketRoute) -> None:
        server = route.connect_to_server()

        def to_server(message: str | bytes) -> None:
            frame = json.loads(message)
            params = longer(frame.get("content")) if frame.get("type") == "send" else None
            if params is not None:
                frame.update(params)
            server.send(json.dumps(frame))

        route.on_message(to_server)

    page.route("**/api/conversations/*/messages", sse)
    page.route_web_socket("**/ws", ws)


def sse_body(events: list[tuple[str, int | None, dict[str, Any]]]) -> str:
    """A text/event-stream body from (event, id, data) triples."""
    out = []
    for event, event_id, data in events:
        lines = [f"event: {event}"]
        if event_id is not None:
            lines.append(f"id: {event_id}")
        lines.append(f"data: {json.dumps(data)}")
        out.append("\n".join(lines) + "\n\n")
    return "".join(out)


def parse_sse(body: str) -> list[tuple[str, int | None, dict[str, Any]]]:
    """(event, id, data) triples of a text/event-stream body (comments dropped), read by the live
    tests' parser (tests/live_server.py `SseReader`)."""
    lines = [*body.replace("\r\n", "\n").split("\n"), ""]  # "": the last event ends
    return [
        (item.event, int(item.id) if item.id and item.id.isdigit() else None, item.json())
        for item in SseReader._parse(iter(lines))
        if isinstance(item, SseEvent)
    ]


# -- a scenario run on SQLite and on PostgreSQL --------------------------------------------------


def stop_mid_reply_then_reload(
    chat: ChatPage,
    admin_request: APIRequestContext,
    database_url: str,
    transport: str,
    shot: str | None = None,
) -> None:
    """Stop a reply mid-stream: the badge says "stopped", the row is `cancelled` with exactly the
    text on screen, the engine runs nothing, and a reload brings back the same text and badge."""
    ask_for_longer_replies(chat.page, 400)  # Stop lands mid-reply on any machine
    chat.open()
    chat.use_transport(transport)
    reply = chat.send(STORY)
    chat.wait_text(reply, 60)
    chat.send_button.click()  # Send is Stop while a reply streams

    expect(chat.badge(reply)).to_have_text("stopped", timeout=15_000)
    expect(reply).to_have_attribute("data-status", "cancelled")
    expect(chat.send_button).to_have_attribute("data-state", "idle")
    expect(reply).to_have_attribute("data-transport", transport)
    if shot:
        screenshot(chat.page, shot)

    stored = chat.stored(reply)
    assert stored["status"] == "cancelled", stored
    assert stored["content"], "nothing was stored before Stop"
    chat.assert_screen_is(reply, stored["content"])
    # The same row, read straight from the database rather than through the API.
    row = db_message(database_url, stored["id"])
    assert (row["status"], row["content"]) == ("cancelled", stored["content"]), row
    assert len(stored["content"]) < 2000, "Stop did not land mid-reply"

    stats = wait_engine_idle(admin_request)
    assert stats["running"] == 0, stats

    shown = stored["content"]
    chat.reload()
    again = chat.assistant_messages().last
    expect(again).to_have_attribute("data-message-id", stored["id"])
    expect(again).to_have_attribute("data-status", "cancelled")
    expect(chat.badge(again)).to_have_text("stopped")
    chat.assert_screen_is(again, shown)
    expect(chat.user_messages().last.get_by_test_id("message-text")).to_have_text(STORY)
