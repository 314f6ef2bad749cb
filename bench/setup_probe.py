"""What one request's set-up costs the server's event loop, measured inside the server.

    uvicorn --factory setup_probe:create_app      (bench/ on PYTHONPATH; used by bench/setup_cost.py)

Wraps whatever `app.web.app:create_app` the server's source tree has (so a `git archive` copy of
an older revision is measured the same way) in an ASGI layer that, for every POST, takes:

- the CPU time of the event-loop thread (`time.thread_time()`: the loop runs in the thread that
  calls the app) from the request's arrival to its `http.response.start`, i.e. everything the
  server does before the reply's stream opens: middleware (session, CSRF), dependencies (the
  user), decoding, the reply service's reads, the engine's validation, the writes. With requests
  sent one at a time to an otherwise idle server nothing else runs on the loop meanwhile, so
  that is the request's own set-up;
- the wall time over the same span (the loop's time plus the waits on the database's threads or
  sockets);
- the database round trips in that span: statements sent (`before_cursor_execute`), transactions
  begun, and connections checked out of the pool (SQLAlchemy's engine and pool events on their
  classes, so every engine of the process is counted: sqlalchemy/engine/events.py,
  sqlalchemy/pool/events.py).

`GET /_bench/setup-probe` answers the samples taken since the last such GET (and forgets them).
With SETUP_PROBE_PROFILE=FILE in the environment, cProfile also runs on the loop's thread over
those same spans (requests one at a time only), and each GET writes the stats gathered since the
last one to FILE (pstats format): where the set-up's loop time goes.
"""

from __future__ import annotations

import cProfile
import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

from app.web.app import create_app as create_real_app

PROBE_PATH = "/_bench/setup-probe"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_counts = {"statements": 0, "transactions": 0, "checkouts": 0}


def _count(name: str) -> Callable[..., None]:
    def bump(*_: Any, **__: Any) -> None:
        _counts[name] += 1

    return bump


event.listen(Engine, "before_cursor_execute", _count("statements"))
event.listen(Engine, "begin", _count("transactions"))
event.listen(Pool, "checkout", _count("checkouts"))


def create_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    app = create_real_app()
    samples: list[dict[str, Any]] = []
    profile_to = os.environ.get("SETUP_PROBE_PROFILE")
    profiler = cProfile.Profile(time.thread_time) if profile_to else None  # CPU, not wall

    async def answer(send: Send) -> None:
        nonlocal profiler
        body = json.dumps(samples).encode()
        samples.clear()
        if profiler is not None and profile_to:
            profiler.dump_stats(profile_to)
            profiler = cProfile.Profile(time.thread_time)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)  # type: ignore[arg-type]
        if scope["path"] == PROBE_PATH:
            return await answer(send)
        if scope["method"] != "POST":
            return await app(scope, receive, send)  # type: ignore[arg-type]
        cpu0, wall0, counts0 = time.thread_time(), time.perf_counter(), dict(_counts)
        if profiler is not None:
            profiler.enable()

        async def timed_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if profiler is not None:
                    profiler.disable()
                sample = {k: _counts[k] - counts0[k] for k in _counts}
                sample.update(
                    path=scope["path"],
                    status=message["status"],
                    loop_cpu_us=(time.thread_time() - cpu0) * 1e6,
                    wall_us=(time.perf_counter() - wall0) * 1e6,
                )
                samples.append(sample)
            await send(message)

        await app(scope, receive, timed_send)  # type: ignore[arg-type]

    return probe
