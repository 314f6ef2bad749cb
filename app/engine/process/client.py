"""ENGINE=process: the engine runs in its own process (`python -m app.engine.process`), shared
by several web worker processes, each of which uses this client as its engine.

The point is the web side's CPU: at GPU rates one event loop cannot both set up a burst of sends
and stream every token (bench/README.md, issue 25 items 5 and 6), so connections are spread over
worker processes with the engine in one, as vLLM's API servers share one engine core. Workers are
replicas in deploy/SCALING.md's sense (one REPLICA_ID each, behind a proxy sticky by session), so
a Stop or a resume that reaches another worker is served as between replicas.

The contract holds as in-process (app/engine/base.py): `generate` validates in the engine process
before it returns (one round trip on the calls connection, app/engine/process/server.py), so a bad
prompt raises here before any row is written; events arrive batched per engine step on the events
connection and go into the same `EventStream`s the engines use. If the engine process goes away,
every open stream ends `error`, `stats().unavailable` says so and new requests are refused with
`EngineUnavailableError` until it is back (the client reconnects by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from app.engine.base import (
    ChatMessages,
    DuplicateRequestError,
    EngineError,
    EngineStats,
    EngineUnavailableError,
    Finished,
    FinishReason,
    SamplingParams,
)
from app.engine.process import wire
from app.engine.streams import EventStream, hop_to_loop
from app.settings import EngineSettings

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0  # a call blocks this worker's loop: an engine process that hangs is let go
RECONNECT_MAX_S = 2.0


@dataclass(slots=True, eq=False)
class _Open:
    """One open request as this worker saw it: what it can say if the engine process dies."""

    stream: EventStream
    queued_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    completion_tokens: int = 0

    def ended(self, reason: FinishReason, why: str) -> Finished:
        now = time.time()
        return Finished(
            reason,
            prompt_tokens=0,  # the engine process knew it; it is gone
            completion_tokens=self.completion_tokens,
            queued_at=self.queued_at,
            first_token_at=self.first_token_at,
            finished_at=now,
            error=why,
        )


class EngineProcessClient:
    def __init__(self, settings: EngineSettings) -> None:
        if not settings.socket_path:
            raise ValueError("ENGINE=process needs ENGINE_SOCKET: the engine process's socket")
        self._path = settings.socket_path
        self._wait_s = settings.process_wait_s
        self._open_requests: dict[str, _Open] = {}
        self._calls: socket.socket | None = None  # None: not connected
        self._call_lock = threading.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._why = "the engine process is not connected yet"
        self._model_name = "(engine process)"
        self._context_size = 0
        self._prompt_overhead = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_size(self) -> int:
        return self._context_size

    @property
    def prompt_overhead(self) -> int:
        return self._prompt_overhead

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Returns once connected: the engine process may still be loading its model, so wait
        for its socket up to ENGINE_PROCESS_WAIT_S."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._wait_s
        reader = await self._connect(deadline)
        self._task = asyncio.create_task(self._serve(reader), name="engine-process-events")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._disconnected("the engine client is shut down", FinishReason.CANCELLED)

    async def _connect(self, deadline: float | None) -> asyncio.StreamReader:
        delay = 0.05
        while True:
            try:
                return await self._open()
            except (OSError, asyncio.IncompleteReadError) as exc:
                if deadline is None:  # reconnecting: `_why` still says what happened
                    pass
                elif time.monotonic() > deadline:
                    raise EngineUnavailableError(
                        f"no engine process answers on {self._path}: {exc}"
                    ) from exc
                else:
                    self._why = f"the engine process is not answering on {self._path} ({exc})"
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _open(self) -> asyncio.StreamReader:
        wire.check_owner(self._path)
        reader, writer = await asyncio.open_unix_connection(self._path)
        try:
            writer.write(wire.encode(("events",)))
            _, worker_id, model_name, context_size, overhead = await wire.read(reader)
            calls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            calls.settimeout(CALL_TIMEOUT_S)
            calls.connect(self._path)  # a local socket: at once, or refused
            calls.sendall(wire.encode(("calls", worker_id)))
        except BaseException:
            writer.close()
            raise
        self._model_name, self._context_size, self._prompt_overhead = (
            model_name,
            context_size,
            overhead,
        )
        self._writer, self._calls = writer, calls
        log.info("connected to engine %s on %s (worker %d)", model_name, self._path, worker_id)
        return reader

    async def _serve(self, reader: asyncio.StreamReader) -> None:
        """Deliver event batches; when the engine process goes away, end what was open and
        connect again."""
        while True:
            try:
                while True:
                    _, batch = await wire.read(reader)
                    for request_id, event in batch:
                        request = self._open_requests.get(request_id)
                        if request is None:
                            continue
                        if isinstance(event, Finished):
                            del self._open_requests[request_id]
                        else:
                            request.completion_tokens += len(event.token_ids)
                            if request.first_token_at is None:
                                request.first_token_at = time.time()
                        request.stream.push(event)
            except (asyncio.IncompleteReadError, ConnectionError):
                log.error("the engine process went away")
            except Exception:  # a frame we cannot read: start again rather than hang the streams
                log.exception("reading the engine process's events failed")
            self._disconnected("the engine process went away", FinishReason.ERROR)
            reader = await self._connect(deadline=None)

    def _disconnected(self, why: str, reason: FinishReason) -> None:
        self._why = why
        if self._writer is not None:
            self._writer.close()
        if self._calls is not None:
            self._calls.close()
        self._writer = self._calls = None
        requests, self._open_requests = self._open_requests, {}
        for request in requests.values():
            request.stream.push(request.ended(reason, why))

    # -- the contract -----------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        """One call to the engine process, waiting for its answer (this worker's loop waits too:
        a step at most, as an engine's own `generate` holds the loop while it tokenises)."""
        with self._call_lock:  # /metrics may be collected on another thread
            calls = self._calls
            if calls is None:
                raise EngineUnavailableError(self._why)
            try:
                calls.sendall(wire.encode((name, *args)))
                status, value = wire.receive(calls)
            except OSError as exc:
                self._call_failed(calls, exc)
        if status == "refused":
            raise value
        if status == "failed":
            raise EngineError(value)
        return value

    def _call_failed(self, calls: socket.socket, exc: OSError) -> NoReturn:
        """A call failed (a timeout included): this connection is out of step now, so drop both;
        the events task sees the end, fails what was open and connects again."""
        calls.close()
        self._calls = None
        self._why = f"the engine process did not answer: {exc}"
        if self._writer is not None:
            self._writer.close()
        raise EngineUnavailableError(self._why) from exc

    def count_tokens(self, message: Mapping[str, str]) -> int:
        return int(self._call("count_tokens", dict(message)))

    def generate(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        *,
        owner: str | None = None,
    ) -> EventStream:
        if request_id in self._open_requests:
            raise DuplicateRequestError(f"request {request_id!r} is already running")
        stream = EventStream(request_id, self.abort)
        # registered before the call: its first events may follow at once
        self._open_requests[request_id] = _Open(stream)
        try:
            self._call("generate", request_id, [dict(m) for m in messages], params, owner)
        except BaseException:
            self._open_requests.pop(request_id, None)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        loop = self._loop
        if loop is None or hop_to_loop(loop, self.abort, request_id):
            return
        request = self._open_requests.get(request_id)
        if request is not None and not request.stream.finished and self._writer is not None:
            self._writer.write(wire.encode(("abort", request_id)))

    def stats(self) -> EngineStats:
        try:
            return self._call("stats")
        except EngineError as exc:
            return EngineStats(0, 0, 0, 0, 0, 0, unavailable=str(exc))
