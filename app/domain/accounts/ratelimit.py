"""Limits on log-in and sign-up attempts, counted when an attempt starts.

Each attempt first *reserves* a slot in every bucket that applies (a sliding window of recent
attempts per key); only then is the password checked. Concurrent attempts therefore cannot slip
past a limit while earlier ones are still inside argon2: the 41st of 40 simultaneous guesses finds
the bucket full. A successful log-in gives its slots back, so only failures (and sign-ups) add up.

Buckets for a log-in, after OWASP's Credential Stuffing Prevention and Authentication cheat sheets
(a stranger must not be able to lock the owner out):

- per client address, any account (`login_max_per_address`): one address spraying many accounts;
- per account *and* address (`login_max_per_account`): guessing one account from one place. A
  stranger who fills this bucket fills it for their own address only;
- per account from unknown devices, all addresses together (`login_max_per_account_total`):
  guessing one account from many addresses. A browser that has logged in to the account before
  holds a signed device cookie (app/domain/accounts/login.py) and is counted per device instead
  of here, so the owner's own browser is never locked out by others' failures ("device cookies").

Sign-ups count per client address (`signup_max_per_address`), successful or not.

Two stores behind one small interface: in this process, or in Redis (`SESSION_STORE_URL`) so
that every replica counts against the same buckets. When Redis cannot be reached the limits fail
closed: the attempt is refused with `SessionStoreUnavailableError` (a 503), never let through
uncounted.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.domain.errors import DomainError, SessionStoreUnavailableError


class TooManyAttemptsError(DomainError):
    """A limit is reached; `retry_after_s` is when a slot frees up."""

    status = 429
    message = "too many attempts: try again shortly"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"too many attempts: retry after {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(math.ceil(self.retry_after_s))}


@dataclass(frozen=True, slots=True)
class Limit:
    key: str
    max_attempts: int
    window_s: float


class AttemptStore(Protocol):
    async def reserve(self, limit: Limit, token: str) -> float:
        """Record attempt `token` under `limit.key` if fewer than `limit.max_attempts` are in the
        window: returns 0. Otherwise record nothing and return the seconds until a slot frees."""
        ...

    async def release(self, key: str, token: str) -> None:
        """Forget attempt `token` under `key` (no-op when unknown)."""
        ...

    async def close(self) -> None: ...


class MemoryAttemptStore:
    """Attempts of this process only. Safe under asyncio: nothing here awaits."""

    SWEEP_ABOVE_KEYS = 10_000  # past this many keys, the expired ones are dropped

    def __init__(self) -> None:
        self._attempts: dict[str, dict[str, float]] = {}  # key -> token -> when it expires

    def _sweep(self, now: float) -> None:
        for key in list(self._attempts):
            live = {t: end for t, end in self._attempts[key].items() if end > now}
            if live:
                self._attempts[key] = live
            else:
                del self._attempts[key]

    async def reserve(self, limit: Limit, token: str) -> float:
        now = time.monotonic()
        if len(self._attempts) > self.SWEEP_ABOVE_KEYS:
            self._sweep(now)
        attempts = self._attempts.setdefault(limit.key, {})
        for old, end in list(attempts.items()):
            if end <= now:
                del attempts[old]
        if len(attempts) >= limit.max_attempts:
            return max(0.001, min(attempts.values()) - now)
        attempts[token] = now + limit.window_s
        return 0.0

    async def release(self, key: str, token: str) -> None:
        attempts = self._attempts.get(key)
        if attempts is not None:
            attempts.pop(token, None)
            if not attempts:
                del self._attempts[key]

    async def close(self) -> None:
        self._attempts.clear()


# One atomic step in Redis: drop what left the window, then add the attempt if there is room.
_RESERVE_LUA = """
local key, token = KEYS[1], ARGV[1]
local window_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_ms)
if redis.call('ZCARD', key) >= limit then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window_ms - now)
end
redis.call('ZADD', key, now, token)
redis.call('PEXPIRE', key, window_ms)
return 0
"""


class RedisAttemptStore:
    """Attempts of every replica, in sorted sets (score: Redis' own clock, in ms)."""

    def __init__(self, redis: Redis, namespace: str) -> None:
        """`redis`: a client built to reconnect by itself (app/web/session_store.py)."""
        self._redis = redis
        self._namespace = namespace
        self._reserve = self._redis.register_script(_RESERVE_LUA)

    def _key(self, key: str) -> str:
        return f"{self._namespace}:{key}"

    async def reserve(self, limit: Limit, token: str) -> float:
        window_ms = max(1, round(limit.window_s * 1000))
        try:
            wait_ms = await self._reserve(
                keys=[self._key(limit.key)], args=[token, window_ms, limit.max_attempts]
            )
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise SessionStoreUnavailableError() from exc  # fail closed: no uncounted attempt
        return int(wait_ms) / 1000

    async def release(self, key: str, token: str) -> None:
        try:
            await self._redis.zrem(self._key(key), token)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise SessionStoreUnavailableError() from exc

    async def close(self) -> None:
        await self._redis.aclose()


@dataclass(frozen=True, slots=True)
class Attempt:
    """Slots held by one attempt; `refund()` gives them back (a successful log-in)."""

    store: AttemptStore
    keys: tuple[str, ...]
    token: str

    async def refund(self) -> None:
        for key in self.keys:
            await self.store.release(key, self.token)


async def reserve_all(store: AttemptStore, limits: Sequence[Limit]) -> Attempt:
    """A slot in every bucket, or none at all and `TooManyAttemptsError`."""
    token = secrets.token_hex(12)
    taken: list[str] = []
    for limit in limits:
        wait_s = await store.reserve(limit, token)
        if wait_s > 0:
            for key in taken:
                await store.release(key, token)
            raise TooManyAttemptsError(wait_s)
        taken.append(limit.key)
    return Attempt(store, tuple(taken), token)


@dataclass(frozen=True)
class AuthLimits:
    """The limits of this app (see app/settings.py) over one store."""

    store: AttemptStore
    login_window_s: float = 900.0
    login_max_per_address: int = 20
    login_max_per_account: int = 5
    login_max_per_account_total: int = 100
    signup_window_s: float = 3600.0
    signup_max_per_address: int = 10

    async def start_login(self, address: str, email: str, device: str | None) -> Attempt:
        """Reserve a log-in attempt; `device` is the id of a device cookie that has logged in to
        this account before (verified by the caller), or None."""
        window = self.login_window_s
        limits = [Limit(f"login:addr:{address}", self.login_max_per_address, window)]
        if device is not None:
            limits.append(Limit(f"login:device:{device}", self.login_max_per_account, window))
        else:
            limits += [
                Limit(f"login:acct:{email}:addr:{address}", self.login_max_per_account, window),
                Limit(f"login:acct:{email}", self.login_max_per_account_total, window),
            ]
        return await reserve_all(self.store, limits)

    async def start_signup(self, address: str) -> Attempt:
        limit = Limit(f"signup:addr:{address}", self.signup_max_per_address, self.signup_window_s)
        return await reserve_all(self.store, [limit])
