"""The synthetic engine's "model": its tokeniser, its prompt format, its markers and its replies.

- "tokens" are 4-byte chunks of UTF-8, both for the prompt (`prompt tokens = ceil(bytes / 4)`) and
  for the reply, so reply tokens split multi-byte characters exactly as byte-level BPE pieces do;
- the reply is deterministic: a function of the rendered prompt and `SamplingParams.seed`. It mixes
  ASCII with accents, CJK, emoji (with modifiers and ZWJ sequences) and right-to-left scripts.

Markers, read from the last user message only (so that a conversation can carry on after one):

- ``[[synthetic:fail-after=N]]``: the request ends with `FinishReason.ERROR` (and an `error` text)
  once N tokens have been sampled; N=0 fails in the first step, before any token. A reply that
  ends on its own before N tokens ends normally.
- ``[[synthetic:tokens=N]]``: the reply is exactly N tokens long (then `stop`), unless `max_tokens`
  or the context cuts it first (`length`). Handy to give every request of a load test the same cost.
- ``[[synthetic:markdown]]``: the reply is Markdown-heavy (headings, nested lists, tables, fenced
  code blocks, long inline code; markdown.py), to measure how the page renders it.
"""

from __future__ import annotations

import hashlib
import re

from app.engine.base import ChatMessages, EngineError

BYTES_PER_TOKEN = 4
_MASK64 = (1 << 64) - 1
_MARKER = re.compile(r"\[\[synthetic:(fail-after|tokens)=(\d+)\]\]")
MARKDOWN_MARKER = "[[synthetic:markdown]]"
_ROLES = frozenset({"system", "user", "assistant"})

# Words the replies are made of: plain ASCII, Latin accents, CJK, emoji (with a skin-tone modifier
# and a ZWJ family), Hebrew and Arabic (right to left), Greek, Cyrillic and some punctuation.
WORDS: tuple[str, ...] = (
    "the", "stream", "token", "reply", "engine", "model", "batch", "cache", "context", "step",
    "and", "of", "a", "to", "is", "in", "that", "with",
    "café", "naïve", "über", "façade", "jalapeño", "Ærø", "smörgåsbord", "crème brûlée",
    "日本語", "中文", "東京", "한국어", "ありがとう",
    "😀", "👋🏽", "🚀", "👨‍👩‍👧", "🇫🇷", "✨",
    "שלום", "مرحبا", "עברית", "العربية",
    "Ελληνικά", "Привет", "—", "…", "«ok»",
)  # fmt: skip


def prompt_token_count(text: str) -> int:
    """The synthetic tokeniser: one token per 4 bytes of UTF-8 (at least one)."""
    return max(1, -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN))


def render_prompt(messages: ChatMessages) -> str:
    """A plain `role: content` transcript; raises `EngineError` on malformed messages."""
    if not messages:
        raise EngineError("no messages to answer")
    lines = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES or not isinstance(content, str):
            raise EngineError(f"bad message: role {role!r}, content must be a string")
        lines.append(f"{role}: {content}\n")
    lines.append("assistant: ")
    return "".join(lines)


def parse_markers(messages: ChatMessages) -> tuple[int | None, int | None]:
    """(fail_after, tokens) from the markers in the last user message, each None when absent."""
    found = {name: int(value) for name, value in _MARKER.findall(last_user_text(messages))}
    return found.get("fail-after"), found.get("tokens")


def last_user_text(messages: ChatMessages) -> str:
    """The markers' source: the last user message (so a conversation can carry on after one)."""
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    return "" if last_user is None else last_user.get("content", "")


def wants_markdown(messages: ChatMessages) -> bool:
    """True when the last user message carries the Markdown marker."""
    return MARKDOWN_MARKER in last_user_text(messages)


class ReplyGenerator:
    """Deterministic reply tokens: 4-byte chunks of a stream of words chosen by a 64-bit LCG."""

    __slots__ = ("_buffer", "_state", "_words")

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64
        self._buffer = b""
        self._words = 0

    def _next_random(self) -> int:
        self._state = (self._state * 6364136223846793005 + 1442695040888963407) & _MASK64
        return self._state >> 33

    def _next_piece(self) -> str:
        """The next bit of text (a word and the separator before it)."""
        word = WORDS[self._next_random() % len(WORDS)]
        sep = "" if self._words == 0 else (".\n\n" if self._next_random() % 17 == 0 else " ")
        self._words += 1
        return sep + word

    def next_token(self) -> tuple[int, bytes]:
        """The next token: (its id, its raw bytes, possibly part of a character)."""
        while len(self._buffer) < BYTES_PER_TOKEN:
            self._buffer += self._next_piece().encode("utf-8")
        piece, self._buffer = self._buffer[:BYTES_PER_TOKEN], self._buffer[BYTES_PER_TOKEN:]
        return int.from_bytes(piece, "little") & 0x7FFFFFFF, piece


def seed_for(prompt: str, seed: int | None) -> int:
    digest = hashlib.blake2b(f"{seed!r}\0{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
