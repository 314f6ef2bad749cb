"""A short, human name for a browser from its User-Agent header ("Firefox on Linux"), for the list
of a user's sessions. Only the common browsers and systems are told apart; anything else is named
by its header's first word. The header is the client's to write: it is shown as text, never markup."""

from __future__ import annotations

import re

# Order matters: Edge and Opera say "Chrome" too, and Chrome says "Safari".
_BROWSERS = (
    ("Edge", re.compile(r"\bEdg(e|A|iOS)?/")),
    ("Opera", re.compile(r"\b(OPR|Opera)/")),
    ("Firefox", re.compile(r"\b(Firefox|FxiOS)/")),
    ("Chrome", re.compile(r"\b(Chrome|Chromium|CriOS|HeadlessChrome)/")),
    ("Safari", re.compile(r"\bSafari/")),
    ("curl", re.compile(r"^curl/")),
    ("Python", re.compile(r"^(python-httpx|python-requests|Python)")),
)
_SYSTEMS = (
    ("Android", re.compile(r"\bAndroid\b")),
    ("iOS", re.compile(r"\b(iPhone|iPad|iPod)\b")),
    ("Windows", re.compile(r"\bWindows\b")),
    ("macOS", re.compile(r"\bMac OS X\b|\bMacintosh\b")),
    ("ChromeOS", re.compile(r"\bCrOS\b")),
    ("Linux", re.compile(r"\bLinux\b")),
)


def browser_name(user_agent: str) -> str:
    """ "Chrome on Windows", "Firefox", "curl"...; "Unknown browser" for an empty header."""
    if not user_agent.strip():
        return "Unknown browser"
    browser = next((name for name, pattern in _BROWSERS if pattern.search(user_agent)), None)
    system = next((name for name, pattern in _SYSTEMS if pattern.search(user_agent)), None)
    if browser is None:
        browser = user_agent.split("/", 1)[0].split(" ", 1)[0][:40] or "Unknown browser"
    return f"{browser} on {system}" if system else browser
