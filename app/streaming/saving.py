"""The final write of every reply: one writer that retries, with backoff, while the process lives.

A reply's end (its whole text and end state, an `Outcome`) is known in memory before the database
has it. This module carries it there, and keeps the "nothing lost while the process lives" rule:

- A final write is never given up on. A failed attempt is retried with exponential backoff and
  jitter (0.2 s, doubling, capped at 10 s; each wait drawn between half and all of that), for as
  long as it takes. Until it is saved the Generation stays registered with the manager, so resume,
  cancel and the admin's live view answer from memory, truthfully: the reply has ended, with this
  text and this status, and it is being saved.
- An attempt waits as long as the driver does: SQLite's busy timeout (DATABASE_BUSY_TIMEOUT_S) when
  another connection holds the write lock; on PostgreSQL a write blocked by a table lock waits
  for the lock (it is pending, not failed); a dropped connection or a refused one fails at once.
- One writer for all pending finals, one attempt in flight: a stalled database then holds two
  pooled connections (this one and the flusher's), not one per ended reply, so the reads that
  resume, cancel and page loads need still get a connection. Every reply that is due is saved in
  one transaction (many replies ending in the same engine step cost one commit; see
  bench/final_save.py); if that fails they are tried one by one, those that never failed first,
  until one fails. The backoff is per reply: a row the database refuses for good waits alone,
  new finals are tried at once, and a success after a stall makes every other pending reply due
  at once (the database answers again).
- Towards clients (the Generation and Subscriber implement it): the `final` event goes out once the
  save is done, keepalives flowing meanwhile; if the save takes longer than `final_wait_s`, it goes
  out anyway marked `saved: false` (its text and status are the true ones, what will be saved).
  A later resume tells whether it has been saved since (its `final` says so).
- Shutdown (`hurry`): the backoff is cut short and pending saves are tried until the shutdown
  deadline (SHUTDOWN_SAVE_DEADLINE_S); the manager logs as errors, with their text lengths, the
  ones that still failed. That is the limit: a process that exits or dies with a save pending
  loses that reply's end; the next start marks its row `interrupted`, with the text last flushed
  before the stall.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from app.streaming import metrics
from app.streaming.generation import Generation, Outcome

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 10.0
MAX_BATCH = 200  # replies' ends saved in one transaction


@dataclass(slots=True)
class _Pending:
    generation: Generation
    due: float  # loop time of the next attempt
    delay: float  # nominal wait after the next failure
    failures: int = 0  # attempts of this reply alone that failed

    @property
    def outcome(self) -> Outcome:
        assert self.generation.outcome is not None
        return self.generation.outcome


class FinalSaver:
    def __init__(
        self,
        save: Callable[[Sequence[Outcome]], Awaitable[object]],
        *,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._save = save
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self._jitter = jitter
        self._queue: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="final-saver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def submit(self, generation: Generation) -> None:
        """Save this ended reply (its `outcome`); `generation.finish()` is called once saved."""
        assert generation.outcome is not None, "only an ended reply can be saved"
        if generation.message_id not in self._queue:
            metrics.FINAL_SAVES_PENDING.inc()
        self._queue[generation.message_id] = _Pending(
            generation, asyncio.get_running_loop().time(), self.first_retry_s
        )
        self._wake.set()

    def hurry(self, max_retry_s: float = 0.5) -> None:
        """Shutting down: retry everything now, and from now on often."""
        self.max_retry_s = min(self.max_retry_s, max_retry_s)
        now = asyncio.get_running_loop().time()
        for item in self._queue.values():
            item.due, item.delay = now, min(item.delay, self.max_retry_s)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            if not self._queue:
                await self._wake.wait()
                continue
            now = loop.time()
            due = [p for p in self._queue.values() if p.due <= now][:MAX_BATCH]
            if not due:  # a submission or `hurry` may bring the next attempt forward
                try:
                    async with asyncio.timeout(min(p.due for p in self._queue.values()) - now):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            await self._save_round(due, loop)

    async def _save_round(self, due: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        """All due replies in one transaction; if that fails, one by one, until one fails."""
        if len(due) > 1:
            for item in due:
                item.generation.save_attempts += 1
            try:
                await self._save([item.outcome for item in due])
            except Exception as exc:
                metrics.FINAL_SAVE_FAILURES.inc()
                log.warning(
                    "saving the ends of %d replies in one transaction failed (%s: %s); "
                    "trying them one by one",
                    len(due),
                    type(exc).__name__,
                    exc,
                )
            else:
                for item in due:
                    self._saved(item)
                self._all_due(loop)
                return
        # Those that never failed first: a row the database refuses cannot hold up the others.
        due.sort(key=lambda item: item.failures)
        for index, item in enumerate(due):
            if not await self._attempt(item, loop):
                for other in due[index + 1 :]:  # the database is still down, most likely
                    other.due = max(other.due, item.due)
                return
        self._all_due(loop)

    async def _attempt(self, item: _Pending, loop: asyncio.AbstractEventLoop) -> bool:
        generation = item.generation
        generation.save_attempts += 1
        try:
            await self._save([item.outcome])
        except Exception as exc:
            metrics.FINAL_SAVE_FAILURES.inc()
            item.failures += 1
            generation.save_error = f"{type(exc).__name__}: {exc}"[:500]
            wait = item.delay * (0.5 + 0.5 * self._jitter())
            item.due = loop.time() + wait
            item.delay = min(item.delay * 2, self.max_retry_s)
            if item.failures == 1:
                log.exception(
                    "saving the end of %s (%s, %d characters) failed: it stays in memory and is "
                    "retried until saved",
                    generation.message_id,
                    generation.status.value,
                    generation.length,
                )
            else:
                log.warning(
                    "the end of %s (%d characters) is still not saved after %d attempts (%s); "
                    "next attempt in %.1f s",
                    generation.message_id,
                    generation.length,
                    generation.save_attempts,
                    generation.save_error,
                    wait,
                )
            return False
        self._saved(item)
        return True

    def _saved(self, item: _Pending) -> None:
        generation = item.generation
        del self._queue[generation.message_id]
        metrics.FINAL_SAVES_PENDING.dec()
        if item.failures:
            log.warning(
                "saved the end of %s after %d attempts, %.1f s after it ended",
                generation.message_id,
                generation.save_attempts,
                time.monotonic() - (generation.ended_at or time.monotonic()),
            )
        generation.finish()

    def _all_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The database answers again: the replies waiting out a backoff need not wait."""
        now = loop.time()
        for other in self._queue.values():
            other.due = min(other.due, now)
