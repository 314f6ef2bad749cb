"""SQLite's one writer, waited for in this process's event loop rather than in SQLite.

SQLite lets one transaction write at a time. A second writer's statement fails with SQLITE_BUSY
and sqlite3 retries it after sleeps that grow to 100 ms (sqlite's default busy handler, until the
busy timeout), in its aiosqlite thread: the lock is handed over late and in no order, so under a
burst of page sends (each holds the lock from its first write to its commit, across a few
event-loop turns) a send could wait out the whole 5 s busy timeout and fail while others got
through, and the waits grew with the pool. Measured on a burst of 1,024 sends
(bench/serving_overhead.py, a pool of 30): 12 sends failed so.

`install` queues this process's writers instead: each transaction takes the gate (an asyncio
lock, first come first served) before its first write statement and lets it go at its commit or
rollback, so SQLite's lock is free whenever a writer of ours asks for it, and the next one in
line gets it as soon as it is let go. Other processes (a CLI command) still meet SQLite's busy
timeout. A writer that waits longer than that timeout here fails as it would have in SQLite:
"database is locked" (SQLITE_BUSY), a 503 (app/db/session.py).

"""

from __future__ import annotations

import asyncio
import sqlite3
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event, util
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.util.concurrency import in_greenlet

_await = getattr(util, "await_", None) or util.await_only  # SQLAlchemy 2.1's name, 2.0's
HELD = "streamchat.sqlite_write_gate"  # in the pooled connection's `info`: the lock it holds
_SQLITE_BUSY = 5


class WriteGate:
    """One lock per event loop (an engine may outlive a loop in tests)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    def take(self, info: dict[str, Any]) -> None:
        """Wait for the gate (from SQLAlchemy's greenlet); raise SQLITE_BUSY past the timeout."""
        lock = self.lock()
        try:
            _await(asyncio.wait_for(lock.acquire(), self.timeout_s))
        except TimeoutError:
            busy = sqlite3.OperationalError(
                "database is locked (waited for this process's writers)"
            )
            busy.sqlite_errorcode = _SQLITE_BUSY  # what app/db/session.py's is_busy reads
            raise busy from None
        info[HELD] = lock


def _writes(context: Any, statement: str) -> bool:
    if context is not None and (
        context.isinsert or context.isupdate or context.isdelete or context.isddl
    ):
        return True
    head = statement.lstrip()[:7].upper()
    return head.startswith(("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"))


def _let_go(info: dict[str, Any]) -> None:
    lock = info.pop(HELD, None)
    if lock is not None and lock.locked():
        lock.release()


def _then_let_go(end: Callable[[Any], None]) -> Callable[[Any], None]:
    def end_then_let_go(connection: Any) -> None:
        try:
            end(connection)
        finally:
            try:
                info = connection.info
            except (AttributeError, NotImplementedError):  # a bare or ad-hoc connection: no gate
                info = None
            if info is not None:
                _let_go(info)

    return end_then_let_go


def install(engine: Engine, timeout_s: float) -> WriteGate:
    """Queue `engine`'s writers on a gate of their own (see the module's docstring)."""
    gate = WriteGate(timeout_s)

    @event.listens_for(engine, "before_cursor_execute")
    def before_write(
        conn: Connection, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool
    ) -> None:
        if HELD not in conn.info and in_greenlet() and _writes(context, statement):
            gate.take(conn.info)

    # Let go once the COMMIT (or ROLLBACK) is done, not before (SQLAlchemy's `commit` and
    # `rollback` events come before it): the dialect's own calls, wrapped on this engine's dialect.
    # Every end goes through them, the pool's rollback of a connection handed back included;
    # they are given the pooled connection, whose `info` is the one `before_write` wrote.
    dialect = engine.dialect
    for name in ("do_commit", "do_rollback"):
        setattr(dialect, name, _then_let_go(getattr(dialect, name)))

    @event.listens_for(engine, "invalidate")
    @event.listens_for(engine, "close")
    def gone(_dbapi: Any, record: Any, *_: Any) -> None:
        _let_go(record.info)

    return gate
