"""What every engine does with its open requests, written once: the table and the output step.

The shape is vLLM's output processor (vllm/v1/engine/output_processor.py: one `RequestState` per
request holding its detokeniser, stop strings and the makings of its final output, and one step
that turns what the engine core produced into what the caller sees):

- `RequestState`: one request's output side. `tokens` takes what the engine sampled (ids and their
  text), counts it, and emits the text that can no longer be taken back (held-back ids ride with
  the next text: `TextDelta.token_ids`); `finish` releases the held-back text and makes the one
  `Finished`. Each engine's own request record extends it with what only that engine needs.
- `RequestTable`: the open requests by id, touched on the event loop only. A request leaves it when
  its `Finished` is delivered into its stream, so an id is free again exactly when its caller has
  seen the end.
- `TableEngine`: `generate()` and `abort()` over the table; an engine adds only how a request is
  validated and built (`_open`), how it reaches the backend (`_submit`) and how an abort does
  (`_abort`).

Where events go is the request's `sink`: straight into the table (`RequestTable.deliver`) for the
engines on the event loop, or, for llama.cpp's loop thread, an outbox handed over once per step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.engine.base import (
    ChatMessages,
    DuplicateRequestError,
    EngineEvent,
    EngineUnavailableError,
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.streams import EventStream, hop_to_loop


def reply_room(prompt_tokens: int, limit: int, params: SamplingParams) -> int:
    """The most tokens the reply may have: `max_tokens`, cut to what `limit` leaves after the
    prompt. Raises `PromptTooLongError` when the prompt leaves no room for even one."""
    if prompt_tokens + 1 > limit:
        raise PromptTooLongError(prompt_tokens, limit)
    return min(params.max_tokens, limit - prompt_tokens)


@dataclass(kw_only=True, eq=False, slots=True)
class RequestState:
    """One request's output side (see the module docstring). Its counts, detokeniser and `done`
    are written only by the thread that produces its tokens (llama.cpp's loop thread, or the event
    loop); `stream`, `sink` and `aborted` only by the event loop."""

    request_id: str
    detok: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    prompt_tokens: int = 0
    queued_at: float = field(default_factory=time.time)
    owner: str | None = None  # whom it is for: fair admission, cache isolation (app.engine.base)
    stream: Any = None  # its EventStream; set by `TableEngine.generate`
    sink: Callable[[RequestState, EngineEvent], None] | None = None  # where its events go
    admitted_at: float | None = None
    first_token_at: float | None = None
    completion_tokens: int = 0  # every token sampled, shown or not
    unsent_ids: list[int] = field(default_factory=list)  # sampled, not yet in a TextDelta
    aborted: bool = False  # abort() (or shutdown) asked for its end
    done: bool = False  # its Finished is made: nothing more is emitted

    def tokens(self, token_ids: Sequence[int], piece: bytes | str, now: float) -> bool:
        """Sampled tokens and their text (bytes, or str from engines that detokenise): emit what is
        stable now; True when a stop string was hit (the caller then finishes it `stop`)."""
        if token_ids:
            self.completion_tokens += len(token_ids)
            self.unsent_ids.extend(token_ids)
            if self.first_token_at is None:
                self.first_token_at = now
        text, stopped = self.detok.push(piece)
        self._text(text)
        return stopped

    def count(self, n: int, now: float) -> None:
        """Tokens sampled that carry no text (an end-of-sequence token)."""
        self.completion_tokens += n
        if self.first_token_at is None:
            self.first_token_at = now

    def finish(
        self, reason: FinishReason, error: str | None = None, now: float | None = None
    ) -> None:
        """End the request: release the held-back text (a stop string's prefix that never came
        whole; nothing after a stop string), then its one `Finished`. Idempotent."""
        if self.done:
            return
        self.done = True
        self._text(self.detok.flush())
        self._emit(
            Finished(
                reason=reason,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                queued_at=self.queued_at,
                first_token_at=self.first_token_at,
                finished_at=time.time() if now is None else now,
                error=error,
                admitted_at=self.admitted_at,
            )
        )

    def _text(self, text: str) -> None:
        if text:
            self._emit(TextDelta(text, tuple(self.unsent_ids)))
            self.unsent_ids.clear()

    def _emit(self, event: EngineEvent) -> None:
        assert self.sink is not None, "a request emits only once it is open"
        self.sink(self, event)


R = TypeVar("R", bound=RequestState)


class RequestTable(Generic[R]):
    """The open requests by id; on the event loop only (see the module docstring)."""

    def __init__(self) -> None:
        self._open: dict[str, R] = {}

    def check_new(self, request_id: str) -> None:
        if request_id in self._open:
            raise DuplicateRequestError(f"request {request_id!r} is already running")

    def add(self, request: R) -> None:
        self._open[request.request_id] = request

    def get(self, request_id: str) -> R | None:
        return self._open.get(request_id)

    def deliver(self, request: RequestState, event: EngineEvent) -> None:
        """Push one event into the request's stream; its `Finished` closes its entry."""
        request.stream.push(event)
        if isinstance(event, Finished) and self._open.get(request.request_id) is request:
            del self._open[request.request_id]

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._open.values()))  # a copy: ending requests leave the table

    def __len__(self) -> int:
        return len(self._open)


class TableEngine(Generic[R]):
    """`generate()` and `abort()` of the engine contract over a `RequestTable`."""

    def __init__(self) -> None:
        self.requests: RequestTable[R] = RequestTable()
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop, once started

    def generate(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        *,
        owner: str | None = None,
    ) -> EventStream:
        """The contract's `generate`: checks, then the engine's own `_open` and `_submit`."""
        if why := self._unavailable():
            raise EngineUnavailableError(why)
        self.requests.check_new(request_id)
        request = self._open(request_id, messages, params, owner)
        request.stream = EventStream(request_id, self.abort)
        request.sink = request.sink or self.requests.deliver
        self.requests.add(request)
        self._submit(request)
        return request.stream

    def abort(self, request_id: str) -> None:
        """The contract's `abort`: from any thread, idempotent; the engine's `_abort` runs once."""
        loop = self._loop
        if loop is None or hop_to_loop(loop, self.abort, request_id):
            return
        request = self.requests.get(request_id)
        if request is not None and not request.aborted and not request.stream.finished:
            request.aborted = True
            self._abort(request)

    # -- what each engine adds --------------------------------------------------------------------

    def _unavailable(self) -> str | None:
        """Why no request can be taken now (None: it can)."""
        raise NotImplementedError

    def _open(
        self, request_id: str, messages: ChatMessages, params: SamplingParams, owner: str | None
    ) -> R:
        """Validate (raising `EngineError`) and build the request; nothing is sent yet."""
        raise NotImplementedError

    def _submit(self, request: R) -> None:
        """Hand the registered request to the backend."""
        raise NotImplementedError

    def _abort(self, request: R) -> None:
        """Make the backend end the request (`aborted` is set); it finishes `cancelled`."""
        raise NotImplementedError
