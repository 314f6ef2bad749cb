"""A model-free engine with the full engine contract, for load-testing everything above the engine.

It behaves like a continuous-batching engine without doing any maths, so that thousands of streams
can be driven on two CPU cores and the layers above (HTTP, SSE, the database, resume) can be
exercised and measured without a model:

- one asyncio task steps every running sequence at once (no task or thread per stream);
- a step takes `synthetic_step_ms + synthetic_per_seq_ms * running` milliseconds, plus
  `synthetic_prefill_ms_per_token` per prompt token of the sequences that join in that step, which is
  how a real decode step's cost grows with the batch;
- at most `max_seqs` sequences run, the rest wait, admitted fairly across owners (the oldest waiting
  request of the owner with the fewest running; FIFO within one owner: see `fair_queue`), the same
  policy as the llama.cpp scheduler; a sequence is admitted only when the
  KV cache (`kv_cells`) can hold its prompt plus the longest reply it may produce, so a running
  sequence never has to be pre-empted (`stats().kv_used` counts the cells actually in use);
- the reply is made by `text`: deterministic, 4-byte "tokens" of mixed scripts, ending on
  its own (`stop`) after a prompt-determined number of tokens unless `max_tokens` or the context
  comes first (`length`); markers in the last user message inject a failure or fix the length.
  Of the sampling settings only `max_tokens`, `seed` and `stop` change it; the others (temperature,
  top-p/k, min-p, the penalties) are accepted, validated by `SamplingParams`, and have no effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from app.engine.base import ChatMessages, EngineStats, FinishReason, SamplingParams
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.fair_queue import FairQueue
from app.engine.requests import RequestState, TableEngine, reply_room
from app.engine.synthetic.markdown import MarkdownReplyGenerator
from app.engine.synthetic.text import (
    ReplyGenerator,
    parse_markers,
    prompt_token_count,
    render_prompt,
    seed_for,
    wants_markdown,
)
from app.settings import EngineSettings

SYNTHETIC_CONTEXT = 8192
"""The synthetic engine's context when ENGINE_CONTEXT leaves it to the model (SmolLM2's)."""

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Sequence(RequestState):
    max_new: int  # the longest reply allowed: min(max_tokens, context and KV room)
    natural_len: int  # where the "model" would emit end-of-sequence
    fail_after: int | None
    generator: ReplyGenerator
    running: bool = False

    @property
    def reserved(self) -> int:
        return self.prompt_tokens + self.max_new


class SyntheticEngine(TableEngine[_Sequence]):
    """The engine contract without a model (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__()
        self._settings = settings
        self._waiting: FairQueue[_Sequence] = FairQueue(lambda seq: seq.owner)
        self._running: list[_Sequence] = []
        self._reserved = 0  # KV cells promised to running sequences
        self._aborted: set[str] = set()  # abort() calls the loop has not handled yet
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._steps = 0
        self._tokens = 0
        self._last_step_ms = 0.0

    # -- the contract ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return "synthetic"

    @property
    def context_size(self) -> int:
        # ENGINE_CONTEXT 0 (the default): SYNTHETIC_CONTEXT, as if the model were trained on it
        return min(self._settings.context_size or SYNTHETIC_CONTEXT, self._settings.kv_cells)

    def count_tokens(self, message: Mapping[str, str]) -> int:
        # its share of `render_prompt`'s transcript (ceilings: never below the whole's count)
        return prompt_token_count(f"{message.get('role')}: {message.get('content')}\n")

    @property
    def prompt_overhead(self) -> int:
        return prompt_token_count("assistant: ")

    async def start(self) -> None:
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._accepting = True
        self._task = asyncio.create_task(self._run(), name="synthetic-engine-loop")

    async def shutdown(self) -> None:
        self._accepting = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._end_all(FinishReason.CANCELLED, None)

    def _unavailable(self) -> str | None:
        return None if self._accepting else "the synthetic engine is not running"

    def _open(
        self, request_id: str, messages: ChatMessages, params: SamplingParams, owner: str | None
    ) -> _Sequence:
        prompt = render_prompt(messages)
        prompt_tokens = prompt_token_count(prompt)
        max_new = reply_room(prompt_tokens, min(self.context_size, self._settings.kv_cells), params)
        fail_after, forced = parse_markers(messages)
        seed = seed_for(prompt, params.seed)
        natural = max(1, forced) if forced is not None else 16 + (seed >> 40) % 240
        return _Sequence(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            max_new=max_new,
            natural_len=natural,
            fail_after=fail_after,
            generator=(MarkdownReplyGenerator if wants_markdown(messages) else ReplyGenerator)(
                seed
            ),
            detok=IncrementalDetokenizer(stop=params.stop),
            owner=owner,
        )

    def _submit(self, seq: _Sequence) -> None:
        self._waiting.append(seq)
        self._wake.set()

    def _abort(self, seq: _Sequence) -> None:
        self._aborted.add(seq.request_id)
        self._wake.set()

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_used=sum(s.prompt_tokens + s.completion_tokens for s in self._running),
            kv_total=self._settings.kv_cells,
            steps=self._steps,
            tokens_generated=self._tokens,
            extra={"last_step_ms": self._last_step_ms},
        )

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        overhead = 0.0  # time the previous step spent handing out events: part of its cost
        try:
            while True:
                self._reap_aborted()
                joined = self._admit()
                if not self._running:
                    overhead = 0.0
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                cost = self._step_seconds(joined)
                self._last_step_ms = cost * 1000.0
                await asyncio.sleep(max(0.0, cost - overhead))
                started = time.perf_counter()
                self._decode_step()
                overhead = time.perf_counter() - started
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave streams hanging
            log.exception("synthetic engine loop failed")
            self._accepting = False
            self._end_all(FinishReason.ERROR, f"synthetic engine failed: {exc!r}")

    def _step_seconds(self, joined: list[_Sequence]) -> float:
        s = self._settings
        prefill = sum(seq.prompt_tokens for seq in joined)
        ms = (
            s.synthetic_step_ms
            + s.synthetic_per_seq_ms * len(self._running)
            + s.synthetic_prefill_ms_per_token * prefill
        )
        return ms / 1000.0

    def _reap_aborted(self) -> None:
        """End aborted sequences, waiting or running, before the next step is priced."""
        if not self._aborted:
            return
        ids, self._aborted = self._aborted, set()
        for request_id in ids:
            seq = self.requests.get(request_id)
            if seq is not None:
                self._finish(seq, FinishReason.CANCELLED)
        self._running = [s for s in self._running if not s.done]

    def _admit(self) -> list[_Sequence]:
        """Move the sequences due next (see `FairQueue`) to running while slots and cells allow."""
        joined: list[_Sequence] = []
        while self._waiting and len(self._running) < self._settings.max_seqs:
            head = self._waiting.peek()
            assert head is not None
            if self._reserved + head.reserved > self._settings.kv_cells:
                break  # nobody overtakes the request due: a big one is never starved
            self._waiting.pop()
            self._running.append(head)
            head.running = True
            head.admitted_at = time.time()
            self._reserved += head.reserved
            joined.append(head)
        return joined

    def _decode_step(self) -> None:
        now = time.time()
        self._steps += 1
        for seq in self._running:
            if seq.aborted:
                self._finish(seq, FinishReason.CANCELLED, now)
            elif seq.fail_after is not None and seq.completion_tokens >= seq.fail_after:
                error = f"synthetic failure injected after {seq.completion_tokens} tokens"
                self._finish(seq, FinishReason.ERROR, now, error)
            else:
                self._sample(seq, now)
        if any(s.done for s in self._running):
            self._running = [s for s in self._running if not s.done]

    def _sample(self, seq: _Sequence, now: float) -> None:
        token_id, piece = seq.generator.next_token()
        self._tokens += 1
        if seq.tokens((token_id,), piece, now):  # a stop string
            self._finish(seq, FinishReason.STOP, now)
        elif seq.completion_tokens >= seq.natural_len:
            self._finish(seq, FinishReason.STOP, now)
        elif seq.completion_tokens >= seq.max_new:
            self._finish(seq, FinishReason.LENGTH, now)

    def _finish(
        self,
        seq: _Sequence,
        reason: FinishReason,
        now: float | None = None,
        error: str | None = None,
    ) -> None:
        if seq.done:
            return
        self._aborted.discard(seq.request_id)
        if seq.running:
            seq.running = False
            self._reserved -= seq.reserved
            self._waiting.done(seq)
        elif seq in self._waiting:
            self._waiting.remove(seq)
        seq.finish(reason, error, now)

    def _end_all(self, reason: FinishReason, error: str | None) -> None:
        self._waiting.clear()  # first: each waiting request then ends without a queue search
        for seq in self.requests:
            self._finish(seq, reason, error=error)
        self._running.clear()
        self._reserved = 0
