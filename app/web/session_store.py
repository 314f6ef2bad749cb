"""The shared session store (`SESSION_STORE_URL`, Redis) and how the app behaves without it.

Every replica keeps its log-in sessions and its log-in limits there, so while Redis is away no
request that needs a session can be served, and no log-in can be counted. What the app does then:

- `/healthz` and `/readyz` never touch the session middleware (app/web/app.py excludes them): the
  process is alive, and `/readyz` answers 503 naming the session store (`session_store_check`);
- any other request that reaches for the store gets a 503 that says what is wrong
  (`SessionStoreUnavailableError`, through the exception map below), never a 500; log-in limits
  fail closed (app/domain/accounts/ratelimit.py);
- once Redis is back, the next request works: a command on a pooled connection that Redis closed
  meanwhile is retried on a fresh one (`Retry`), and an idle connection is checked before use
  (`health_check_interval`). While Redis is down a request fails within a second, not after
  redis-py's default ten tries.

A burst of requests waits for a pooled connection instead of failing: redis-py's default pool
raises `MaxConnectionsError` (a ConnectionError: a 503 here) as soon as its 100 connections are
all in use (redis/asyncio/connection.py, `ConnectionPool.get_connection`), which failed 80-90% of
a burst of 1,024 page sends (bench/web_workers.py). A `BlockingConnectionPool` of the same size
queues them, up to `POOL_WAIT_S`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from litestar import Request, Response
from litestar.stores.base import StorageObject, Store
from litestar.stores.memory import MemoryStore
from litestar.stores.redis import RedisStore
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.domain.errors import SessionStoreUnavailableError
from app.web.errors import domain_error_response

log = logging.getLogger(__name__)

SESSION_NAMESPACE = "streamchat-sessions"
STORE_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
"""What redis-py raises when the store cannot be reached (a BusyLoadingError, Redis still loading
its data after a restart, is a ConnectionError)."""
RETRIES = 2  # a stale pooled connection fails once; the retry reconnects
PING_TIMEOUT_S = 1.0
POOL_CONNECTIONS = 100  # redis-py's default size, per process
POOL_WAIT_S = 5.0  # a request waits this long for a pooled connection before its 503


def redis_client(url: str) -> Redis:
    """A client that reconnects by itself, gives up fast while Redis is down, and makes a burst
    wait its turn for a connection."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=POOL_CONNECTIONS,
        timeout=POOL_WAIT_S,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), RETRIES),
        retry_on_error=list(STORE_ERRORS),
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        health_check_interval=10,
    )
    return Redis.from_pool(pool)  # the client owns the pool: closing it closes the pool


class LocalStore(MemoryStore):
    """Litestar's MemoryStore without its lock on the hot paths (get, set, delete).

    MemoryStore takes one anyio Lock around every operation, and anyio's Lock yields to the event
    loop once taken (unless `fast_acquire`: anyio/_backends/_asyncio.py, `Lock.acquire`), so it
    is held across a loop turn: a burst of requests, each loading its session, went through the
    session middleware one per turn, each paying for a cancel scope, a future and a wake-up. These
    operations never await between reading and writing the dict: on the one event loop they are
    atomic as they are."""

    __slots__ = ()

    async def get(self, key: str, renew_for: int | timedelta | None = None) -> bytes | None:
        stored = self._store.get(key)
        if not stored:
            return None
        if stored.expired:
            self._store.pop(key, None)
            return None
        if renew_for and stored.expires_at:
            stored = StorageObject.new(data=stored.data, expires_in=renew_for)
            self._store[key] = stored
        return stored.data

    async def set(
        self, key: str, value: str | bytes, expires_in: int | timedelta | None = None
    ) -> None:
        data = value.encode() if isinstance(value, str) else value
        self._store[key] = StorageObject.new(data=data, expires_in=expires_in)

    async def delete(self, key: str) -> None:
        self._store.pop(key, None)


def session_store(url: str | None) -> Store:
    """Server-side sessions live in memory, or in Redis when replicas must share them."""
    if url:
        return RedisStore(
            redis_client(url), namespace=SESSION_NAMESPACE, handle_client_shutdown=True
        )
    return LocalStore()


async def session_store_check(store: Store) -> str | None:
    """For /readyz: "ok", or why the shared store cannot serve now; None for sessions in memory."""
    if not isinstance(store, RedisStore):
        return None
    try:
        # RedisStore keeps its client as `_redis` (litestar/stores/redis.py) and has no ping of its own
        await asyncio.wait_for(store._redis.ping(), PING_TIMEOUT_S)
    except (*STORE_ERRORS, TimeoutError, OSError) as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


def store_unavailable_response(request: Request, exc: Exception) -> Response[object]:
    """A redis-py connection error anywhere in a request (the session middleware's load or save):
    the same 503 as the log-in limiter's own `SessionStoreUnavailableError`."""
    log.warning("session store unreachable on %s %s: %r", request.method, request.url.path, exc)
    return domain_error_response(request, SessionStoreUnavailableError())


STORE_EXCEPTION_HANDLERS = {cls: store_unavailable_response for cls in STORE_ERRORS}
