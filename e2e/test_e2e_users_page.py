"""The admin's users page and audit log page in the browser (issue 24, items 2 and 6): change a
role and back, disable and enable, log a user out everywhere (their open page goes to the log-in
page), create an account, delete one; then the audit log lists each of those actions, filtered by
action and by who, the deleted user's entries kept. axe on both pages. (Approval, invitations,
reset links and quotas have their own files: test_e2e_signup_*.py, test_e2e_account.py,
test_e2e_quotas.py.)"""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import Locator, Page, expect

from e2e.axe import assert_accessible
from e2e.conftest import User
from e2e.helpers import STORY, ChatPage, ask_for_longer_replies, unique_email
from tests.live_server import TEST_PASSWORD


def user_row(page: Page, email: str) -> Locator:
    page.goto(f"/admin/users?q={email}")
    return page.locator(f"[data-testid=admin-user][data-email='{email}']")


def click_and_confirm(page: Page, button: Locator) -> None:
    page.once("dialog", lambda dialog: dialog.accept())  # the action's "Disable ...?" question
    button.click()
    expect(page).to_have_url(re.compile(r"/admin/users$"))  # done: back to the list


def test_an_admin_manages_accounts_from_the_users_page_and_the_audit_log_shows_it(
    admin: User, new_user: Callable[..., User]
) -> None:
    user = new_user("managed")
    chat = ChatPage(user.page).open()
    expect(user.page.locator("#app")).to_have_attribute("data-push", "connected")
    users = admin.context.new_page()

    row = user_row(users, user.email)
    expect(row.get_by_test_id("user-role")).to_have_text("user")
    expect(row.get_by_test_id("user-state")).to_have_text("active")
    assert_accessible(users, "/admin/users")
    users.get_by_role("button", name=f"Make admin: {user.email}").click()
    expect(user_row(users, user.email).get_by_test_id("user-role")).to_have_text("admin")
    users.get_by_role("button", name=f"Make user: {user.email}").click()
    expect(user_row(users, user.email).get_by_test_id("user-role")).to_have_text("user")

    click_and_confirm(users, user_row(users, user.email).get_by_test_id("user-disable"))
    expect(user_row(users, user.email)).to_have_attribute("data-state", "disabled")
    users.get_by_role("button", name=f"Enable {user.email}").click()
    expect(user_row(users, user.email)).to_have_attribute("data-state", "active")

    user_row(users, user.email).get_by_test_id("user-logout").click()
    expect(users).to_have_url(re.compile(r"/admin/users$"))
    # That browser's page hears it at once on its push channel and goes to the log-in page.
    expect(chat.page).to_have_url(re.compile(r"/login"), timeout=5_000)

    created = unique_email("created")
    users.goto("/admin/users")
    form = users.get_by_test_id("create-user")
    form.get_by_test_id("new-email").fill(created)
    form.get_by_test_id("new-password").fill(TEST_PASSWORD)
    form.get_by_test_id("create-user-submit").click()
    expect(users).to_have_url(re.compile(r"/admin/users$"))
    expect(user_row(users, created).get_by_test_id("user-state")).to_have_text("active")

    click_and_confirm(users, user_row(users, created).get_by_test_id("user-delete"))
    user_row(users, created)
    expect(users.get_by_test_id("admin-user")).to_have_count(0)
    expect(users.get_by_test_id("admin-users")).to_contain_text("No users match.")

    # The audit log: everything above, with who did it; filtered by action, then by who.
    users.goto("/admin/audit")
    log = users.get_by_test_id("audit-entry")
    for action in ("role", "disable", "enable", "logout_everywhere", "create", "delete"):
        expect(log.and_(users.locator(f"[data-action={action}]")).first).to_be_visible()
    assert_accessible(users, "/admin/audit")

    users.get_by_test_id("audit-who").fill(user.email)
    users.get_by_role("button", name="Filter").click()
    expect(users).to_have_url(re.compile(r"who="))
    expect(log).to_have_count(5)  # two role changes, disable, enable, log out everywhere
    for entry in log.all():
        expect(entry).to_contain_text(user.email)
        expect(entry).to_contain_text(admin.email)

    users.get_by_test_id("audit-action").select_option("role")
    users.get_by_role("button", name="Filter").click()
    expect(log).to_have_count(2)
    expect(log.first).to_have_attribute("data-action", "role")

    users.goto(f"/admin/audit?action=delete&who={created}")  # the deleted account's entry stays
    expect(log).to_have_count(1)
    expect(log.first).to_contain_text(created)
    users.close()


def test_a_reply_the_admin_kills_from_the_live_view_says_an_admin_stopped_it(
    admin: User, new_user: Callable[..., User]
) -> None:
    """Not "You stopped this reply.": the user's page says who did, live and after a reload."""
    user = new_user("killed")
    chat = ChatPage(user.page).open()
    ask_for_longer_replies(user.page, 2000, only=STORY)  # still streaming when the admin acts
    reply = chat.send(STORY)
    chat.wait_text(reply, 20)
    message_id = reply.get_attribute("data-message-id")

    live = admin.context.new_page()
    live.goto("/admin/live")
    live.get_by_role("button", name=f"Kill reply {message_id}").click()
    expect(reply).to_have_attribute("data-status", "cancelled", timeout=5_000)
    expect(chat.badge(reply)).to_have_text("stopped by an admin")
    expect(chat.badge(reply)).to_have_attribute("title", "An admin stopped this reply.")
    chat.reload()
    expect(chat.badge(chat.assistant_messages().first)).to_have_text("stopped by an admin")
    live.close()
