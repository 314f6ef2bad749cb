"""Password hashing with argon2id.

Hashing costs about a quarter of a second of CPU on purpose, so it runs in a worker thread (argon2
releases the GIL): an event loop that is streaming replies must not stall while someone logs in.
"""

from __future__ import annotations

import asyncio

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from app.domain.errors import DomainError

MIN_PASSWORD_LENGTH = 8

hasher = PasswordHasher()
"""argon2-cffi's current recommended parameters. Tests may swap in a cheaper one."""

_DUMMY_HASH: str | None = None


class WeakPasswordError(DomainError, ValueError):
    """The password is too short to be accepted."""


def check_password_strength(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPasswordError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")


async def hash_password(password: str) -> str:
    return await asyncio.to_thread(hasher.hash, password)


async def verify_password(password_hash: str, password: str) -> bool:
    """True when `password` matches; never raises for a wrong password or a malformed hash."""
    try:
        return await asyncio.to_thread(hasher.verify, password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    """True when the hash was made with other parameters than the current ones."""
    try:
        return hasher.check_needs_rehash(password_hash)
    except InvalidHashError:
        return True


async def burn_verification_time(password: str) -> None:
    """Spend what a real verification would, so an unknown email answers as slowly as a known one."""
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = await hash_password("not a real password")
    await verify_password(_DUMMY_HASH, password)
