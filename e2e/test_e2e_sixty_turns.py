"""Issue 22's 60-turn conversation, through the page like a user, in Chromium against the real
SmolLM2 model, on SQLite and PostgreSQL at once: the module's server (SQLite) and a second one on
a throwaway PostgreSQL database, one user on each, every turn sent on both pages before either is
checked. Each server decodes on one llama.cpp thread, so together they take about one's time.

Why: the shorter tests (tests/serving/test_live_context_window.py, 12 turns over the API;
test_e2e_context_window.py, 5 turns on the page) show each piece; this one shows they hold over
a conversation that overflows the model's context many times, where a window that drifts, a
divider left behind or a meter a turn late would show.

The chat's settings, set in its panel: temperature 0 (greedy: the same replies each run; the page
sends no seed, none is needed) and replies of up to 200 tokens; the questions ask for stories and
essays, so most replies run 100-200 tokens. With ENGINE_CONTEXT 1024 a prompt holds about three
turns, and the history overflows every few turns. Checked:

- after every one of the 60 turns: the reply ended completed (or cut at its length) with text;
  the meter shows the server's count, the final frame's `context_tokens` (the page's copy of the
  frame), equal to the stored prompt + reply tokens, of the 1,024-token context; the divider sits
  exactly above the message the server stored as the latest reply's `window_start_id` (none while
  that is null); the window starts at a question, never moves back, and the prompt fits with the
  reply's reserve;
- then: the window moved at least 3 times, in steps (most turns keep the previous start); the
  median reply is at least 100 tokens;
- regenerating the latest reply keeps its window (the same divider); editing an old question
  answers on its short branch, with no divider, and so does regenerating that reply; switching
  back to the long branch brings its divider back;
- the conversation exported as JSON from the page and imported through the page keeps every
  reply's window on the same message (under its new id), the copy shows the same divider, and
  one more turn on the copy answers, its window where the copy's left off or later.

Its time is the model's: some 12,000 tokens a backend, each decoded on one llama.cpp thread. It
prints the wall time of the 60 turns and the model's share (one backend alone: 4 min 45 s to 6
min at load 2-7 on the shared 2-CPU box, the model 85-90% of it).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, Response, expect

from e2e.conftest import E2E_ENV, User, _signed_up
from e2e.helpers import ChatPage, api_json, in_thread
from tests.live_databases import migrated_database
from tests.live_server import LiveServer, server_env

CONTEXT = 1024
REPLY = 200
TURNS = 60
REPLY_TIMEOUT_MS = 120_000
DIVIDER = "[data-testid=context-divider]"
TOPICS = [
    "dragons", "the sea", "mountains", "bread", "trains", "owls", "rain", "castles", "volcanoes",
    "bees", "the moon", "forests", "pirates", "robots", "rivers", "winter", "gardens", "deserts",
    "lighthouses", "wolves",
]  # fmt: skip
ASKS = [
    "Tell me a long story about {}.",
    "Write a detailed essay about {}.",
    "Describe {} in many sentences, with examples.",
]


@pytest.fixture(scope="module")
def server_env_overrides() -> dict[str, object]:
    return {"ENGINE_CONTEXT": CONTEXT}


def question(n: int) -> str:
    ask = ASKS[(n // len(TOPICS)) % len(ASKS)]
    return f"Question {n + 1}: " + ask.format(TOPICS[n % len(TOPICS)])


def latest(page: Page, conversation: str) -> dict[str, Any]:
    """The conversation's newest two messages and its context, as the page's own API reads them."""
    return api_json(page.request, f"/api/conversations/{conversation}?limit=2")


def wait_reply(chat: ChatPage, reply: Locator) -> str:
    """The reply's end, by the page's signals (its status leaves "streaming", Send is back)."""
    return chat.wait_done(reply, timeout_s=REPLY_TIMEOUT_MS / 1000)


def send(chat: ChatPage, text: str) -> Locator:
    """Send `text` from the composer; returns its reply, which may still be streaming.
    (ChatPage.send also waits to see the reply streaming, which a reply that ends fast can skip.)"""
    before = chat.assistant_messages().count()
    chat.composer.fill(text)
    chat.send_button.click()
    expect(chat.assistant_messages()).to_have_count(before + 1)
    return chat.assistant_messages().nth(before)


def turn(chat: ChatPage, text: str) -> Locator:
    """Send `text`; returns its reply once ended."""
    reply = send(chat, text)
    wait_reply(chat, reply)
    return reply


def check_turn(chat: ChatPage, reply: Locator | None = None) -> dict[str, Any]:
    """The latest reply ended with text; the meter and the divider say what the server stored
    for it (and, for a reply streamed on this page, what its final frame said). Returns its row."""
    page = chat.page
    data = latest(page, chat.conversation_id())
    row = [m for m in data["messages"] if m["role"] == "assistant"][-1]
    assert row["status"] in ("completed", "length") and row["content"].strip(), row
    assert data["context"]["context_size"] == CONTEXT
    used = row["prompt_tokens"] + row["completion_tokens"]
    assert row["prompt_tokens"] + REPLY <= CONTEXT, row  # the prompt left the reply its room
    if reply is not None:
        expect(reply).to_have_attribute("data-message-id", row["id"])
        frame = reply.evaluate(
            "el => [el._view.reply.status, el._view.reply.contextTokens, el._view.reply.contextSize]"
        )
        assert frame == [row["status"], used, CONTEXT], (frame, row)

    meter = page.get_by_test_id("context-meter")
    expect(meter).to_be_visible()
    expect(meter.locator(".context-meter-text")).to_have_text(f"{used:,} / {CONTEXT:,} tokens")
    bar = page.get_by_role("meter", name="Model context used")
    expect(bar).to_have_attribute("aria-valuenow", str(used))
    expect(bar).to_have_attribute("aria-valuemax", str(CONTEXT))

    divider = page.locator(f"#messages > {DIVIDER}")
    start = row["window_start_id"]
    if start is None:
        expect(divider).to_have_count(0)
    else:
        expect(divider).to_have_count(1)
        below = page.locator(f"#messages > {DIVIDER} + [data-testid=message]")
        expect(below).to_have_attribute("data-message-id", start)
        expect(below).to_have_attribute("data-role", "user")  # a window starts at a question
    return row


def moves(starts: list[str | None]) -> int:
    return sum(1 for a, b in itertools.pairwise(starts) if a != b)


def set_chat_settings(page: Page) -> None:
    """Temperature 0 and replies of up to REPLY tokens, in the chat's settings panel."""

    def settings(method: str) -> Callable[[Response], bool]:
        return lambda r: r.url.endswith("/settings") and r.request.method == method

    # The panel fills itself from a GET as it opens: typing before it lands would be undone.
    with page.expect_response(settings("GET")):
        page.get_by_test_id("open-settings").click()
    page.get_by_test_id("set-temperature").fill("0")
    page.get_by_test_id("set-max_tokens").fill(str(REPLY))
    with page.expect_response(settings("PUT")) as saved:
        page.get_by_test_id("settings-save").click()
    assert saved.value.ok, saved.value.status
    expect(page.get_by_test_id("settings-panel")).to_be_hidden()


def export_json(page: Page, folder: Path) -> Path:
    page.get_by_test_id("export").locator("summary").click()
    with page.expect_download() as download:
        page.get_by_test_id("export-json").click()
    saved = folder / download.value.suggested_filename
    download.value.save_as(saved)
    return saved


def windows_by_content(document: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
    """Each message, keyed by what it is (created, role, text), with its window's start named the
    same way: two exports compare without their ids."""
    by_id = {m["id"]: m for m in document["messages"]}

    def key(m: dict[str, Any]) -> tuple[str, str, str]:
        return (m["created_at"], m["role"], m["content"])

    keyed = {key(m): m for m in document["messages"]}
    assert len(keyed) == len(document["messages"]), "two messages alike"
    return {
        k: (key(by_id[m["window_start_id"]]) if m.get("window_start_id") else None, m["status"])
        for k, m in keyed.items()
    }


def check_windows(messages: list[dict[str, Any]]) -> list[str | None]:
    """Each reply's window starts at a question before it (or none) and never moves back;
    returns the starts, oldest reply first."""
    index = {m["id"]: i for i, m in enumerate(messages)}
    starts: list[str | None] = []
    last = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = m["window_start_id"]
        at = 0 if start is None else index[start]
        assert at < i and messages[at]["role"] == "user", (i, start)
        assert at >= last, f"reply {i}: the window moved back"
        last = at
        starts.append(start)
    return starts


@pytest.fixture(scope="module")
def postgres_server(
    module_dir: Path, server_env_overrides: dict[str, object]
) -> Iterator[LiveServer]:
    """A second server beside the module's SQLite one, on a throwaway PostgreSQL database: the two
    conversations run at once, one llama.cpp thread each, so the two backends take one's time."""
    folder = module_dir / "postgresql"
    folder.mkdir()
    manager = migrated_database("postgresql", folder)
    url = in_thread(manager.__enter__)
    env = server_env("llamacpp", url, folder, **{**E2E_ENV, **server_env_overrides})
    live = LiveServer(env, folder / "server.log", migrate=False)
    try:
        yield live.start()
    finally:
        live.stop()
        in_thread(manager.__exit__, None, None, None)


def open_chat(user: User) -> ChatPage:
    """A new conversation on the user's page, set to greedy replies of up to REPLY tokens."""
    page = user.page
    chat = ChatPage(page).open()
    chat.new_chat()
    page.wait_for_function("() => location.hash.length > 1")
    conversation = chat.conversation_id()
    set_chat_settings(page)
    chosen = api_json(page.request, f"/api/conversations/{conversation}/settings")["settings"]
    assert (chosen["temperature"], chosen["max_tokens"]) == (0, REPLY), chosen
    assert latest(page, conversation)["context"]["reply_tokens"] == REPLY
    return chat


@pytest.mark.timeout(1200)  # 2 x 64 replies of the real model on a shared 2-CPU box
def test_sixty_turns_through_the_page_on_sqlite_and_postgresql(
    new_user: Callable[..., User],
    browser: Browser,
    database_url: str,
    postgres_server: LiveServer,
    tmp_path: Path,
) -> None:
    assert database_url.startswith("sqlite") and "postgresql" in postgres_server.env["DATABASE_URL"]
    on_postgresql = _signed_up(browser, postgres_server, "sixty-pg")
    try:
        chats = {"sqlite": open_chat(new_user("sixty")), "postgresql": open_chat(on_postgresql)}
        began = time.monotonic()
        for n in range(TURNS):  # each turn sent on both pages, then each checked
            replies = {name: send(chat, question(n)) for name, chat in chats.items()}
            for name, chat in chats.items():
                wait_reply(chat, replies[name])
                check_turn(chat, replies[name])
        print(f"\n{TURNS} turns on both backends in {time.monotonic() - began:.0f} s")
        for name, chat in chats.items():
            print(f"{name}:", end=" ")
            after_sixty_turns(chat, tmp_path / name)
    finally:
        on_postgresql.context.close()
    assert not on_postgresql.page_errors, on_postgresql.page_errors


def after_sixty_turns(chat: ChatPage, folder: Path) -> None:
    """The conversation's windows moved in steps; regenerate, edit, branch switch, export and
    import keep what the model saw."""
    page = chat.page
    conversation = chat.conversation_id()
    folder.mkdir()
    messages = api_json(page.request, f"/api/conversations/{conversation}?limit=500")["messages"]
    assert len(messages) == 2 * TURNS
    starts = check_windows(messages)
    replies = [m for m in messages if m["role"] == "assistant"]
    lengths = [m["completion_tokens"] for m in replies]
    model_s = sum(m["ttft_ms"] + m["gap_p50_ms"] * m["completion_tokens"] for m in replies) / 1000
    print(f"window moves: {moves(starts)}; reply tokens: median {statistics.median(lengths)}, "
          f"min {min(lengths)}, max {max(lengths)}; the model's time (TTFT + p50 gap x tokens): "
          f"about {model_s:.0f} s")  # fmt: skip
    assert moves(starts) >= 3, starts  # it overflowed, again and again
    assert moves(starts) <= (TURNS - 1) // 2, starts  # in steps: most turns keep the start
    assert statistics.median(lengths) >= 100, lengths
    assert sum(100 <= n <= 300 for n in lengths) >= 0.8 * TURNS, lengths

    # Regenerate the latest reply: the same window, the same divider.
    last = messages[-1]
    chat.assistant_messages().last.get_by_test_id("regenerate").click()
    wait_reply(chat, chat.assistant_messages().last)
    again = check_turn(chat, chat.assistant_messages().last)
    assert again["id"] != last["id"]
    assert (again["window_start_id"], again["prompt_tokens"]) == (
        last["window_start_id"],
        last["prompt_tokens"],
    )

    # Edit the second question: its branch is short, so the model saw all of it: no divider.
    second = chat.user_messages().nth(1)
    second.get_by_test_id("edit").click()
    second.get_by_test_id("edit-input").fill(question(99))
    second.get_by_test_id("edit-save").click()
    expect(chat.user_messages()).to_have_count(2)
    edited = chat.assistant_messages().nth(1)
    wait_reply(chat, edited)
    assert check_turn(chat, edited)["window_start_id"] is None
    # ... and regenerating that old turn's reply answers too, with no divider either.
    edited.get_by_test_id("regenerate").click()
    wait_reply(chat, chat.assistant_messages().nth(1))
    assert check_turn(chat, chat.assistant_messages().nth(1))["window_start_id"] is None
    # Back to the long branch: its divider again.
    chat.user_messages().nth(1).get_by_test_id("branch-prev").click()
    expect(chat.user_messages().last).to_contain_text(f"Question {TURNS}:")
    assert check_turn(chat)["window_start_id"] == last["window_start_id"]

    # Export (JSON, from the page) and import (through the page): the same windows.
    saved = export_json(page, folder)
    page.get_by_test_id("import-file").set_input_files(str(saved))
    expect(page).not_to_have_url(re.compile(conversation))
    copy = chat.conversation_id()
    expect(chat.user_messages().last).to_contain_text(f"Question {TURNS}:")
    exported = json.loads(saved.read_text())
    again_exported = api_json(page.request, f"/api/conversations/{copy}/export?format=json")
    assert windows_by_content(again_exported) == windows_by_content(exported)
    imported = check_turn(chat)  # the copy's divider and meter, from its stored counts
    assert imported["window_start_id"] not in (None, last["window_start_id"])  # a new id

    # One more turn on the copy answers, its window where the copy's was or later.
    check_turn(chat, turn(chat, question(TURNS)))
    branch = api_json(page.request, f"/api/conversations/{copy}?limit=500")["messages"]
    assert len(branch) == 2 * TURNS + 2
    check_windows(branch)
