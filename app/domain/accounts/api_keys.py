"""API key secrets: how they are made, shown and stored.

A key looks like `sk-sc-<43 url-safe characters>` (256 random bits). The user sees it once; the
database keeps its SHA-256 (hex) and a short prefix to tell keys apart in a list. Verifying hashes
the presented secret and looks the hash up by equality, so no comparison ever runs over a stored
secret and the timing of the lookup says nothing about any key.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-sc-"
_RANDOM_BYTES = 32
_SHOWN_CHARS = 6  # random characters kept after KEY_PREFIX for the list view


@dataclass(frozen=True, slots=True)
class NewApiKey:
    secret: str  # the only time the secret exists outside the client
    prefix: str
    key_hash: str


def hash_api_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def generate_api_key() -> NewApiKey:
    secret = KEY_PREFIX + secrets.token_urlsafe(_RANDOM_BYTES)
    return NewApiKey(
        secret=secret,
        prefix=secret[: len(KEY_PREFIX) + _SHOWN_CHARS],
        key_hash=hash_api_key(secret),
    )


def looks_like_api_key(value: str) -> bool:
    """A cheap syntactic check, to answer garbage without touching the database."""
    return value.startswith(KEY_PREFIX) and len(value) <= 200
