"""Light and dark themes (static/css/theme.css, static/js/theme.js): the page follows the system
setting, a toggle overrides it on the chat, auth and admin pages, the choice is remembered and
applied before the first paint, other tabs follow, and highlighted code has its colours in both.
The dark theme's screenshot is artifacts/dark-theme.png."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Browser, Page, expect

from e2e.conftest import User
from e2e.helpers import ChatPage, db_set_content, screenshot
from e2e.test_e2e_a11y import CODE_REPLY
from tests.live_server import LiveServer

# theme.css: --fg (the text of every page), and --hl-keyword, of each theme.
FG = {"light": "rgb(27, 29, 33)", "dark": "rgb(231, 233, 237)"}
KEYWORD = {"light": "rgb(207, 34, 46)", "dark": "rgb(255, 123, 114)"}

# Recorded when the parser inserts <body>, before anything of the page can be painted: the theme
# it would be painted in (a deferred or module script would set it only after the whole document).
FIRST_FRAME = """
new MutationObserver((records, observer) => {
  if (!document.body) return;
  observer.disconnect();
  window.__firstFrame = {
    theme: document.documentElement.dataset.theme || null,
    fg: getComputedStyle(document.body).color,
  };
}).observe(document, { childList: true, subtree: true });
"""


def painted(page: Page) -> str:
    """The theme the page shows now, by the colour of its text."""
    fg = page.evaluate("getComputedStyle(document.body).color")
    assert fg in FG.values(), fg
    return next(name for name, value in FG.items() if value == fg)


def first_frame(page: Page) -> dict[str, str | None]:
    page.wait_for_function("() => window.__firstFrame")
    return page.evaluate("window.__firstFrame")


def test_the_theme_follows_the_system_and_the_toggle_is_remembered(
    new_user: Callable[..., User], database_url: str
) -> None:
    user = new_user("theme")
    user.context.add_init_script(FIRST_FRAME)
    page = user.page
    page.emulate_media(color_scheme="dark")
    chat = ChatPage(page).open()
    toggle = page.get_by_test_id("theme-toggle")
    assert painted(page) == "dark"
    expect(toggle).to_have_attribute("aria-pressed", "true")

    # A reply with highlighted code, in the dark theme's colours: the screenshot.
    reply = chat.send("Say hi.")
    chat.wait_done(reply)
    message_id = reply.get_attribute("data-message-id")
    assert message_id
    db_set_content(database_url, message_id, CODE_REPLY)
    chat.reload()
    keyword = page.locator("pre code .hljs-keyword").first
    expect(keyword).to_have_css("color", KEYWORD["dark"])
    screenshot(page, "dark-theme")

    # The toggle overrides the system, remembered across loads and applied before the first paint.
    toggle.click()
    assert painted(page) == "light"
    expect(toggle).to_have_attribute("aria-pressed", "false")
    expect(keyword).to_have_css("color", KEYWORD["light"])
    assert page.evaluate("localStorage.getItem('theme')") == "light"
    chat.reload()
    assert first_frame(page) == {"theme": "light", "fg": FG["light"]}
    assert painted(page) == "light"
    page.emulate_media(color_scheme="light")
    page.emulate_media(color_scheme="dark")
    assert painted(page) == "light", "a system change undid the user's choice"

    # Choosing the system's own theme forgets the choice: the page follows the system again.
    toggle.click()
    assert painted(page) == "dark"
    assert page.evaluate("localStorage.getItem('theme')") is None
    page.emulate_media(color_scheme="light")
    assert painted(page) == "light"
    expect(toggle).to_have_attribute("aria-pressed", "false")


def test_other_tabs_follow_the_toggle(new_user: Callable[..., User]) -> None:
    user = new_user("theme-tabs")
    one = ChatPage(user.page).open().page
    other = ChatPage(user.context.new_page()).open().page
    for page in (one, other):
        page.emulate_media(color_scheme="light")
        assert painted(page) == "light"
    one.get_by_test_id("theme-toggle").click()
    assert painted(one) == "dark"
    expect(other.locator("html")).to_have_attribute("data-theme", "dark")
    assert painted(other) == "dark"
    expect(other.get_by_test_id("theme-toggle")).to_have_attribute("aria-pressed", "true")


def test_the_toggle_on_the_auth_and_admin_pages(
    browser: Browser, server: LiveServer, admin: User
) -> None:
    context = browser.new_context(base_url=server.url, color_scheme="light")
    context.add_init_script(FIRST_FRAME)
    try:
        page = context.new_page()
        page.goto("/login")
        assert painted(page) == "light"
        page.get_by_test_id("theme-toggle").click()
        assert painted(page) == "dark"
        page.goto("/signup")
        assert first_frame(page) == {"theme": "dark", "fg": FG["dark"]}
        assert painted(page) == "dark"
    finally:
        context.close()

    page = admin.page
    page.add_init_script(FIRST_FRAME)
    page.emulate_media(color_scheme="light")
    page.goto("/admin")
    assert painted(page) == "light"
    page.get_by_test_id("theme-toggle").click()
    assert painted(page) == "dark"
    for path in ("/admin/live", "/admin/charts"):
        page.goto(path)
        assert first_frame(page) == {"theme": "dark", "fg": FG["dark"]}
        expect(page.get_by_test_id("theme-toggle")).to_have_attribute("aria-pressed", "true")
    page.get_by_test_id("theme-toggle").click()  # back to the system's (light): forgotten
    assert page.evaluate("localStorage.getItem('theme')") is None
