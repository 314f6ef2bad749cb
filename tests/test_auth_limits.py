"""The attempt stores behind the log-in and sign-up limits, in this process and in real Redis.

Both must give exactly `max_attempts` slots to any number of concurrent reservations, free a slot
when an attempt is refunded or leaves the window, and say how long until one frees.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from app.domain.accounts.ratelimit import (
    AttemptStore,
    AuthLimits,
    Limit,
    MemoryAttemptStore,
    RedisAttemptStore,
    TooManyAttemptsError,
    reserve_all,
)
from app.web.session_store import redis_client

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[AttemptStore]:
    if request.param == "memory":
        yield MemoryAttemptStore()
        return
    namespace = f"streamchat-test-limits-{secrets.token_hex(4)}"
    redis_store = RedisAttemptStore(redis_client(REDIS_URL), namespace)
    try:
        yield redis_store
    finally:
        await redis_store.close()
        cleanup = aioredis.Redis.from_url(REDIS_URL)
        keys = [key async for key in cleanup.scan_iter(f"{namespace}:*")]
        if keys:
            await cleanup.delete(*keys)
        await cleanup.aclose()


async def test_concurrent_reservations_get_exactly_the_limit(store: AttemptStore) -> None:
    limit = Limit("k", max_attempts=3, window_s=60)
    results = await asyncio.gather(
        *(reserve_all(store, [limit]) for _ in range(50)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, TooManyAttemptsError)]
    assert (len(granted), len(refused)) == (3, 47)
    assert all(0 < r.retry_after_s <= 60 for r in refused)


async def test_a_refund_frees_its_slot_and_a_refusal_holds_none(store: AttemptStore) -> None:
    wide, narrow = Limit("wide", 3, 60), Limit("narrow", 1, 60)
    first = await reserve_all(store, [wide, narrow])
    for _ in range(3):  # refused by `narrow`: the `wide` slot each took is given back
        with pytest.raises(TooManyAttemptsError):
            await reserve_all(store, [wide, narrow])
    await reserve_all(store, [wide])
    await reserve_all(store, [wide])  # 3 of 3: the refusals above left nothing behind
    with pytest.raises(TooManyAttemptsError):
        await reserve_all(store, [wide])
    await first.refund()
    await reserve_all(store, [wide, narrow])


async def test_attempts_leave_the_window(store: AttemptStore) -> None:
    limit = Limit("short", max_attempts=2, window_s=0.3)
    await reserve_all(store, [limit])
    await reserve_all(store, [limit])
    with pytest.raises(TooManyAttemptsError) as refused:
        await reserve_all(store, [limit])
    assert 0 < refused.value.retry_after_s <= 0.3
    await asyncio.sleep(0.35)
    await reserve_all(store, [limit])


async def test_a_known_device_is_counted_apart_from_strangers(store: AttemptStore) -> None:
    limits = AuthLimits(store, login_max_per_account=2, login_max_per_account_total=3)
    for address in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        await limits.start_login(address, "owner@example.com", device=None)
    with pytest.raises(TooManyAttemptsError):  # this address's share of the account is full
        await limits.start_login("10.0.0.1", "owner@example.com", device=None)
    with pytest.raises(TooManyAttemptsError):  # and the account's total for unknown browsers
        await limits.start_login("10.0.0.3", "owner@example.com", device=None)
    # The owner's browser, known by its device cookie, is not held back, even from 10.0.0.1;
    # its own failures count against its own share.
    await limits.start_login("10.0.0.1", "owner@example.com", device="d1")
    await limits.start_login("10.0.0.1", "owner@example.com", device="d1")
    with pytest.raises(TooManyAttemptsError):
        await limits.start_login("10.0.0.1", "owner@example.com", device="d1")


async def test_the_memory_store_forgets_expired_keys() -> None:
    """One-off keys (an address seen once) do not pile up in a long-running process."""
    store = MemoryAttemptStore()
    store.SWEEP_ABOVE_KEYS = 10
    for i in range(20):
        await reserve_all(store, [Limit(f"once-{i}", 5, window_s=0.05)])
    await asyncio.sleep(0.1)
    await reserve_all(store, [Limit("fresh", 5, window_s=60)])
    assert len(store._attempts) == 1
