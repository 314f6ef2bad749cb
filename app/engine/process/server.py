"""An engine served to web workers in other processes, over one Unix socket.

Each web worker opens two connections (app/engine/process/client.py):

- **events**: the engine process says hello (the worker's id, the model's name, context size and
  prompt overhead), then sends every event of that worker's requests, batched: whatever the
  engine handed out in one turn of this process's event loop (a step's worth) goes in one frame,
  so a worker wakes once per step, not once per token. The worker sends `abort`s the same way.
- **calls**: the contract's synchronous methods (`generate`, `count_tokens`, `stats`), one frame
  each way, answered on this process's event loop between steps. `generate` validates here, so
  a bad prompt is refused before the worker writes any row, as with an engine in-process.

Request ids are the worker's own: the engine sees them prefixed by the worker's id, so two
workers never collide. A worker that goes away (its events connection closes) has its open
requests aborted: nobody would read their text. So has one that stops reading its events
(`max_unread_bytes` left in its socket's buffer): this process's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Mapping
from typing import Any

from app.engine.base import Engine, EngineError, EngineEvent, Finished
from app.engine.process import wire
from app.engine.streams import EventStream

log = logging.getLogger(__name__)


MAX_UNREAD_BYTES = 64 * 1024 * 1024


class _Worker:
    """One connected web worker: its open requests and its outbound batch of events."""

    def __init__(self, worker_id: int, writer: asyncio.StreamWriter, max_unread_bytes: int) -> None:
        self.worker_id = worker_id
        self.writer = writer
        self.max_unread_bytes = max_unread_bytes
        self.open: set[str] = set()
        self._batch: list[tuple[str, EngineEvent]] = []
        self.closed = False

    def engine_id(self, request_id: str) -> str:
        return f"{self.worker_id}:{request_id}"

    def send(self, request_id: str, event: EngineEvent) -> None:
        if self.closed:
            return
        if not self._batch:  # the first event of this turn: write the batch once the turn ends
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append((request_id, event))

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch and not self.closed:
            self.writer.write(wire.encode(("events", batch)))
            unread = self.writer.transport.get_write_buffer_size()
            if unread > self.max_unread_bytes:
                # A worker that stopped reading (its loop stuck) would grow this process's
                # memory without end: let it go; its requests are aborted as it leaves, and it
                # connects again once it reads (app/engine/process/client.py).
                log.error("worker %d left %d bytes unread: disconnected", self.worker_id, unread)
                self.closed = True
                self.writer.transport.abort()


class EngineServer:
    def __init__(
        self, engine: Engine, path: str, *, max_unread_bytes: int = MAX_UNREAD_BYTES
    ) -> None:
        """`max_unread_bytes`: events a worker may leave unread before it is disconnected."""
        self.engine = engine
        self.path = path
        self.max_unread_bytes = max_unread_bytes
        self._workers: dict[int, _Worker] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        # each open connection's handler, and its writer: closing that ends the handler
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket left by an earlier run
        old_umask = os.umask(0o177)  # the socket is born 0600: only this user may connect
        try:
            self._server = await asyncio.start_unix_server(self._connection, path=self.path)
        finally:
            os.umask(old_umask)
        log.info("engine %s served on %s", self.engine.model_name, self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            # End every connection's handler here: one the loop's teardown cancels instead is
            # logged as an error by asyncio's streams (the task's exception() raises).
            for writer in list(self._handlers.values()):
                writer.close()
            if self._handlers:
                await asyncio.wait(list(self._handlers), timeout=5)
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers[handler] = writer
        try:
            kind, *args = await wire.read(reader)
            if kind == "events":
                await self._events(reader, writer)
            elif kind == "calls":
                await self._calls(self._workers[args[0]], reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, KeyError):
            pass  # the worker went away (or named one that did)
        finally:
            writer.close()
            self._handlers.pop(handler, None)

    async def _events(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker = _Worker(next(self._ids), writer, self.max_unread_bytes)
        self._workers[worker.worker_id] = worker
        e = self.engine
        writer.write(
            wire.encode(
                ("hello", worker.worker_id, e.model_name, e.context_size, e.prompt_overhead)
            )
        )
        try:
            while True:
                kind, request_id = await wire.read(reader)
                if kind == "abort":
                    self.engine.abort(worker.engine_id(request_id))
        finally:
            worker.closed = True
            del self._workers[worker.worker_id]
            for request_id in list(worker.open):
                self.engine.abort(worker.engine_id(request_id))
            if worker.open:
                log.warning(
                    "worker %d went away: %d requests aborted", worker.worker_id, len(worker.open)
                )

    async def _calls(
        self, worker: _Worker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            name, *args = await wire.read(reader)
            try:
                reply: tuple[str, Any] = ("ok", self._call(worker, name, args))
            except EngineError as exc:
                reply = ("refused", exc)
            except Exception as exc:  # a bug: the worker's call fails with its text, we go on
                log.exception("engine call %s failed", name)
                reply = ("failed", f"{type(exc).__name__}: {exc}")
            writer.write(wire.encode(reply))

    def _call(self, worker: _Worker, name: str, args: list[Any]) -> Any:
        if name == "generate":
            request_id, messages, params, owner = args
            self._generate(worker, request_id, messages, params, owner)
            return None
        if name == "count_tokens":
            return self.engine.count_tokens(args[0])
        if name == "stats":
            return self.engine.stats()
        raise ValueError(f"unknown call {name!r}")

    def _generate(
        self,
        worker: _Worker,
        request_id: str,
        messages: list[Mapping[str, str]],
        params: Any,
        owner: str | None,
    ) -> None:
        stream = self.engine.generate(worker.engine_id(request_id), messages, params, owner=owner)
        assert isinstance(stream, EventStream), "every engine's stream is an EventStream"
        worker.open.add(request_id)

        def ended(done: asyncio.Future[Finished]) -> None:
            worker.open.discard(request_id)
            if not done.cancelled() and done.exception() is None:
                worker.send(request_id, done.result())

        stream.forward_to(lambda event: worker.send(request_id, event)).add_done_callback(ended)
