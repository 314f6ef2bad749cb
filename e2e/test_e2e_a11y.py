"""Accessibility: axe-core on every page and state, in the light and the dark theme; the streaming
reply announced once to screen readers; the whole chat worked from the keyboard alone.

axe (e2e/axe.py) must find no serious or critical violation on: log-in and sign-up; the chat page
empty, streaming, stopped, with highlighted code and a reply's details, with the API-key dialog
open, and as a phone-sized drawer; every admin page (conversations, one conversation, live replies
with a reply running, charts). Each theme is the system setting Chromium emulates
(`prefers-color-scheme`), which theme.css follows.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import STORY, ChatPage, ask_for_longer_replies, db_set_content
from tests.live_server import LiveServer

THEMES = ["light", "dark"]

# A stored reply with code in several languages, a table, a quote and a link: the highlight colours
# and the Markdown styles are checked for contrast in both themes.
CODE_REPLY = """Here is a **Python** function, and the same in `JavaScript`:

```python
import math

def area(radius: float) -> float:
    \"\"\"The area of a circle.\"\"\"
    if radius < 0:
        raise ValueError(f"negative radius: {radius}")
    return math.pi * radius ** 2  # πr²
```

```js
export function area(radius) {
  if (radius < 0) throw new Error(`negative radius: ${radius}`);
  return Math.PI * radius ** 2; // πr²
}
```

```html
<p class="note" id="x">Hi <!-- comment --></p>
```

```diff
- removed
+ added
```

| Language | Lines |
|---|--:|
| Python | 6 |

> See [the docs](https://docs.python.org/3/library/math.html).
"""


def dark_or_light(page: Page, theme: str) -> None:
    page.emulate_media(color_scheme=theme)


def stream_then_stop(chat: ChatPage, check: Callable[[str], None]) -> Locator:
    """Send STORY (long enough to outlast the checks), run `check("streaming")` while it streams,
    Stop it with Escape, run `check("stopped")`; returns the stopped reply."""
    reply = chat.send(STORY)
    chat.wait_text(reply, 20)
    check("streaming")
    expect(reply).to_have_attribute("data-status", "streaming")  # still streaming after the check
    chat.page.keyboard.press("Escape")
    expect(reply).to_have_attribute("data-status", "cancelled", timeout=15_000)
    check("stopped")
    return reply


@pytest.mark.parametrize("theme", THEMES)
def test_auth_pages_are_accessible(browser: Browser, server: LiveServer, theme: str) -> None:
    context = browser.new_context(base_url=server.url, color_scheme=theme)
    try:
        page = context.new_page()
        for path in ("/login", "/signup"):
            page.goto(path)
            assert_accessible(page, f"{path} ({theme})")
    finally:
        context.close()


@pytest.mark.parametrize("theme", THEMES)
def test_chat_page_is_accessible(
    new_user: Callable[..., User], database_url: str, theme: str
) -> None:
    user = new_user("a11y")
    page = user.page
    dark_or_light(page, theme)
    ask_for_longer_replies(page, 400)  # Stop lands mid-reply on any machine
    chat = ChatPage(page).open()
    assert_accessible(page, f"chat, empty ({theme})")

    reply = stream_then_stop(
        chat, lambda state: assert_accessible(page, f"chat, {state} ({theme})")
    )

    # Highlighted code, a table, a quote, a link; the reply's details open.
    message_id = reply.get_attribute("data-message-id")
    assert message_id
    db_set_content(database_url, message_id, CODE_REPLY)
    chat.reload()
    stored = chat.assistant_messages().last
    expect(stored.locator("pre code span.hljs-keyword").first).to_be_visible()
    stored.get_by_test_id("details").click()
    expect(stored.get_by_test_id("message-details")).to_be_visible()
    assert_accessible(page, f"chat, highlighted code and details ({theme})")

    page.get_by_test_id("account").click()
    expect(page.locator("#account-dialog")).to_be_visible()
    assert_accessible(page, f"chat, API-key dialog ({theme})")
    page.keyboard.press("Escape")
    expect(page.locator("#account-dialog")).to_be_hidden()

    page.get_by_test_id("open-settings").click()  # the per-conversation settings panel
    expect(page.get_by_test_id("settings-panel")).to_be_visible()
    assert_accessible(page, f"chat, settings panel ({theme})")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("settings-panel")).to_be_hidden()

    # A phone: the conversation list as a drawer over the page.
    page.set_viewport_size({"width": 400, "height": 780})
    page.get_by_test_id("sidebar-toggle").click()
    expect(page.locator("#sidebar")).to_be_visible()
    assert_accessible(page, f"chat, phone with the drawer open ({theme})")


@pytest.mark.parametrize("theme", THEMES)
def test_admin_pages_are_accessible(new_user: Callable[..., User], admin: User, theme: str) -> None:
    user = new_user("a11y-admin")
    ask_for_longer_replies(user.page, 400)
    chat = ChatPage(user.page).open()
    page = admin.page
    dark_or_light(page, theme)

    def live_page(state: str) -> None:
        if state != "streaming":
            return
        page.goto("/admin/live")
        expect(page.get_by_test_id("live-generation").first).to_be_visible()
        assert_accessible(page, f"/admin/live, a reply running ({theme})")

    stream_then_stop(chat, live_page)
    conversation_id = chat.conversation_id()
    page.goto("/admin/live")
    expect(page.get_by_test_id("no-live")).to_be_visible()
    assert_accessible(page, f"/admin/live, idle ({theme})")

    for path in ("/admin", f"/admin/conversations/{conversation_id}", "/admin/charts"):
        page.goto(path)
        expect(page.locator(".admin-main h1")).to_be_visible()
        assert_accessible(page, f"{path} ({theme})")


def test_a_streaming_reply_is_announced_once_not_token_by_token(
    new_user: Callable[..., User],
) -> None:
    """The status line (role=status, aria-live=polite) says the reply started, then reads it once
    it has ended; the growing text is no live region, and its message is aria-busy meanwhile."""
    page = new_user("a11y-live").page
    chat = ChatPage(page).open()
    page.evaluate(
        """() => {
          const region = document.getElementById("sr-status");
          window.__said = [];
          new MutationObserver(() => {
            if (region.textContent) window.__said.push(region.textContent);
          }).observe(region, { childList: true, characterData: true, subtree: true });
        }"""
    )
    status = page.locator("#sr-status")
    expect(status).to_have_attribute("role", "status")
    expect(status).to_have_attribute("aria-live", "polite")

    reply = chat.send("Write two sentences about the sea.")
    expect(reply).to_have_attribute("aria-busy", "true")
    chat.wait_done(reply)
    expect(reply).to_have_attribute("aria-busy", "false")
    shown = reply.get_by_test_id("message-text").inner_text()
    assert len(shown.split()) >= 3, shown  # several tokens streamed, each a chance to announce

    # The announcer speaks 50 ms after it is called (static/js/dom.js `announcer`): wait for the
    # end's announcement rather than read the list the moment the reply is marked done.
    # A function, not an expression: an expression that is not true at once is polled through
    # eval, which the page's CSP (script-src 'self') refuses.
    page.wait_for_function("() => window.__said.length >= 2", timeout=5000)
    page.wait_for_timeout(300)  # anything more it would say comes within this
    said = page.evaluate("window.__said")
    assert said[0] == "Sent. The assistant is replying.", said
    last = said[-1]
    assert re.sub(r"\s+", " ", last).startswith("Reply "), said
    assert re.sub(r"\s+", " ", shown).strip() in re.sub(r"\s+", " ", last), (shown, said)
    assert len(said) == 2, f"announced more than the start and the end: {said}"
    # Nothing inside the messages is a live region: the text is not read as it grows.
    assert page.locator("#messages [aria-live]").count() == 0


# -- the keyboard alone --------------------------------------------------------------------------


def focused(page: Page) -> dict[str, str | None]:
    return page.evaluate(
        """() => {
          const el = document.activeElement;
          const style = getComputedStyle(el);
          return {
            testid: el.dataset.testid || null,
            id: el.id || null,
            outline: `${style.outlineStyle} ${style.outlineWidth}`,
          };
        }"""
    )


def tab_to(page: Page, testid: str, *, back: bool = False, limit: int = 60) -> None:
    """Press Tab (or Shift+Tab) until the element with `testid` has the focus, and check that
    it shows it (a :focus-visible outline)."""
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        now = focused(page)
        if now["testid"] == testid:
            style, width = str(now["outline"]).split()
            assert style != "none" and float(width.removesuffix("px")) >= 2, (testid, now)
            return
    raise AssertionError(f"Tab never reached {testid}")


@pytest.mark.parametrize("theme", THEMES)
def test_everything_works_from_the_keyboard(new_user: Callable[..., User], theme: str) -> None:
    """Send, Stop, regenerate, switch conversations, the theme toggle, and dialogs that close on
    Escape and give the focus back; every control on the way shows its focus."""
    page = new_user("keys").page
    dark_or_light(page, theme)
    ask_for_longer_replies(page, 400)
    chat = ChatPage(page).open()
    keys = page.keyboard

    # Send with Enter; Stop with Escape; the focus stays in the composer.
    tab_to(page, "composer")
    keys.type("Tell me a story about a fox.")
    keys.press("Enter")
    first = chat.assistant_messages().last
    expect(first).to_have_attribute("data-status", "streaming")
    chat.wait_text(first, 10)
    keys.press("Escape")
    expect(first).to_have_attribute("data-status", "cancelled", timeout=15_000)
    expect(chat.composer).to_be_focused()
    first_conversation = chat.conversation_id()

    # Regenerate from its button (Shift+Tab back from the composer); Stop from the Stop button.
    tab_to(page, "regenerate", back=True)
    keys.press("Enter")
    regenerated = chat.assistant_messages().last
    expect(regenerated).to_have_attribute("data-status", "streaming")
    expect(chat.composer).to_be_focused()
    chat.wait_text(regenerated, 10)
    tab_to(page, "send")
    expect(chat.send_button).to_have_attribute("data-state", "streaming")
    keys.press("Enter")
    expect(regenerated).to_have_attribute("data-status", "cancelled", timeout=15_000)

    # A new chat, then back to the first conversation from the list.
    tab_to(page, "new-chat", back=True)
    keys.press("Enter")
    expect(chat.composer).to_be_focused()
    keys.type("Say hi.")
    keys.press("Enter")
    chat.wait_done(chat.assistant_messages().last)
    assert chat.conversation_id() != first_conversation
    tab_to(page, "conversation-link", back=True)  # the oldest, last in the list: the first one
    keys.press("Enter")
    expect(page).to_have_url(re.compile(f"#{first_conversation}$"))
    expect(chat.assistant_messages()).to_have_count(1)
    assert focused(page)["testid"] == "conversation-link", "the focus left the list"

    # The delete dialog: Escape closes it and the focus returns to its button.
    tab_to(page, "delete-conversation")
    keys.press("Enter")
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(page.get_by_test_id("confirm-delete")).to_be_focused()
    keys.press("Escape")
    expect(dialog).to_be_hidden()
    assert focused(page)["testid"] == "delete-conversation"

    # The API-key dialog: open with Enter, Escape closes it, the focus returns to its button.
    tab_to(page, "account")
    keys.press("Enter")
    account = page.locator("#account-dialog")
    expect(account).to_be_visible()
    assert page.evaluate(
        "document.getElementById('account-dialog').contains(document.activeElement)"
    )
    keys.press("Escape")
    expect(account).to_be_hidden()
    assert focused(page)["testid"] == "account"

    # The theme toggle, with Space.
    toggle = page.get_by_test_id("theme-toggle")
    before = toggle.get_attribute("aria-pressed")
    tab_to(page, "theme-toggle")
    keys.press("Space")
    expect(toggle).not_to_have_attribute("aria-pressed", before or "")
    expect(toggle).to_be_focused()
