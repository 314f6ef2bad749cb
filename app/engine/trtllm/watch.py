"""Whether TensorRT-LLM's executor has died under the adapter.

With a worker process (the default), the proxy learns of the worker's death only through its MPI
future: executor/proxy.py `mpi_done_callback` puts the error on `_error_queue` and nothing else,
so the requests the worker held never get a final response and their streams would wait forever;
the next `generate_async` raises the error and shuts the LLM down (executor/executor.py
`_handle_background_error`). In-process, a failed executor loop shuts the LLM down the same way.
`executor_failure` looks at both without consuming anything; the engine polls it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from app.engine.base import EngineUnavailableError

WATCH_S = 0.5  # how often the engine looks: a dead worker's replies end within about this


def executor_failure(llm: Any) -> str | None:
    """Why `llm` can serve nothing more (None: it can, as far as can be seen)."""
    executor = getattr(llm, "_executor", None)
    if executor is None:
        return "TensorRT-LLM's executor is gone"
    for future in getattr(executor, "mpi_futures", None) or ():
        if future.done():
            error = None if future.cancelled() else future.exception()
            return f"TensorRT-LLM's worker process exited: {error or 'without an error'}"
    shut_down = getattr(executor, "is_shutdown", None)
    if callable(shut_down) and shut_down():
        return "TensorRT-LLM's executor has shut down"
    return None


RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between attempts to rebuild a dead LLM


async def rebuild(
    build: Callable[[], Awaitable[None]], why: str, failed: Callable[[str], None]
) -> None:
    """`build` a new LLM until it works, backing off between tries; `failed` hears each failure
    (the engine reports it as why it is unavailable)."""
    for attempt in itertools.count():
        try:
            await build()
        except EngineUnavailableError as exc:
            delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
            failed(f"{why}; restarting TensorRT-LLM failed ({exc}), next try in {delay:g} s")
            await asyncio.sleep(delay)
            continue
        return
