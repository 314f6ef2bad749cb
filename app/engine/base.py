"""The engine contract: what every inference engine offers, and all that the layers above may use.

An engine turns chat messages into a stream of events. It knows nothing of HTTP or databases.

    stream = engine.generate(request_id, messages, params, owner="u1")  # validates now: may raise
    async for event in stream:                                # TextDelta ... then one Finished
        ...
    engine.abort(request_id)                                  # from anywhere, any time, idempotent

`generate` checks its input eagerly (template, tokenisation, context length), so a caller can answer
bad input with a clear error before it commits to a streaming response. The stream it returns always
ends with exactly one `Finished` event, whatever happens: abort, shutdown or an engine failure.

`owner` is an opaque key naming whom a request is for (the layers above pass a user id); the engine
knows nothing of users and uses it for two things only:

- fair admission: when requests wait for a free sequence, the next one admitted belongs to the
  owner with the fewest requests running (ties: the oldest waiting request first), FIFO within one
  owner, so one owner's flood cannot hold everyone else behind it;
- isolation: state kept between requests (a prefix cache) is reused only by requests of the same
  owner, so one owner's reply never depends on what others asked, and no owner can learn from a
  cache hit's speed that someone else sent the same prompt.

Requests without an owner (`None`) share one bucket, as if one owner sent them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

ChatMessages = Sequence[Mapping[str, str]]
"""OpenAI-style messages: each a mapping with `role` ("system", "user", "assistant") and `content`."""


class EngineError(Exception):
    """Input the engine cannot serve; raised by `generate` before any event is produced."""


class PromptTooLongError(EngineError):
    """The rendered prompt (plus room for at least one new token) does not fit the context."""

    def __init__(self, prompt_tokens: int, context_size: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_size = context_size
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the model's context holds {context_size} "
            f"(including the reply): shorten the conversation"
        )

    def __reduce__(self) -> tuple[type, tuple[int, int]]:  # crosses to a web worker intact
        return (type(self), (self.prompt_tokens, self.context_size))


class EngineUnavailableError(EngineError):
    """The engine is not running (not started yet, or shutting down)."""


class DuplicateRequestError(EngineError):
    """A request with this id is already running."""


class FinishReason(StrEnum):
    STOP = "stop"  # end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens, or the context filled up
    CANCELLED = "cancelled"  # abort(), or shutdown
    ERROR = "error"  # the engine failed; `Finished.error` says how


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest one; 0 means off
    # Penalties on the tokens of the reply so far (not the prompt's), as OpenAI defines them:
    # logit -= count * frequency_penalty + (count > 0) * presence_penalty; 0 means off.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # llama.cpp's (CTRL's) multiplicative penalty on the same tokens: 1 means off, > 1 discourages.
    repeat_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be 0 (off) or positive")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise ValueError("at most 4 stop strings, none empty")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be between 0 and 1")
        for name in ("frequency_penalty", "presence_penalty"):  # OpenAI's range
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be between -2 and 2")
        if not 0.0 < self.repeat_penalty <= 2.0:
            raise ValueError("repeat_penalty must be in (0, 2]")

    @property
    def penalised(self) -> bool:
        """Whether any penalty is on (each engine leaves them out otherwise)."""
        return (self.frequency_penalty, self.presence_penalty, self.repeat_penalty) != (0, 0, 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New stable text (never half a character, never a possible stop-string prefix)."""

    text: str
    token_ids: tuple[
        int, ...
    ]  # the tokens sampled since the previous event (may be more than the text shows)

    def __reduce__(self) -> tuple[type, tuple[str, tuple[int, ...]]]:
        # Pickled per token to web workers (app/engine/process): a slotted dataclass's default
        # pickling calls dataclasses.fields() for every object, a third of the engine process's
        # time at 1,024 streams (bench/web_workers.py --profile).
        return (TextDelta, (self.text, self.token_ids))


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every stream. Timestamps are wall-clock seconds (`time.time()`)."""

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int  # every token the engine sampled for this request, shown or not
    queued_at: float
    first_token_at: float | None  # None when no token was produced
    finished_at: float
    error: str | None = None
    admitted_at: float | None = None  # left the waiting queue (None: never admitted, or unknown)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:  # as TextDelta's
        return (
            Finished,
            (
                self.reason,
                self.prompt_tokens,
                self.completion_tokens,
                self.queued_at,
                self.first_token_at,
                self.finished_at,
                self.error,
                self.admitted_at,
            ),
        )


EngineEvent = TextDelta | Finished


@dataclass(frozen=True, slots=True)
class BackendStats:
    """One server an engine sends requests to (ENGINE=openai's upstreams), as it sees it."""

    name: str  # its address
    up: bool  # False: marked down after failures, probed until it answers again
    in_flight: int  # requests it is serving for this engine now
    capacity: int  # the most it is sent at once
    requests: int  # requests sent to it since start
    errors: int  # of those, the ones that failed (before or after their first token)
    ttft_sum_s: float  # time to first token, summed over the requests that got one
    ttft_count: int
    ttft_buckets: tuple[tuple[float, int], ...] = ()  # (upper bound in s, cumulative count)
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """An engine's cache of earlier prompts' KV cells, as admissions found it."""

    hits: int  # admitted requests that started from a cached prefix
    misses: int  # admitted requests that found none
    reused_tokens: int  # prompt tokens not prefilled thanks to it
    entries: int
    host_bytes: int  # host memory its saved states take (0 where they stay in the KV pool)


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int  # sequences holding KV cache and advancing each step
    waiting: int  # admitted to the queue, not yet running
    kv_used: int  # KV cells (tokens) in use
    kv_total: int
    steps: int  # engine steps taken since start
    tokens_generated: int  # tokens sampled since start
    extra: Mapping[str, float] = field(default_factory=dict)
    # KV cells each query of the last step walked: a unified pool's attention reads every cell up
    # to its highest occupied one, free or another sequence's (None: not known for this engine)
    kv_walked: int | None = None
    backends: tuple[BackendStats, ...] = ()  # the servers behind the engine, if any
    prefix_cache: PrefixCacheStats | None = None  # None: the engine keeps none of its own
    unavailable: str | None = None  # why the engine cannot serve a request now (None: it can)
    degraded: str | None = None  # what is wrong while it still serves (some upstreams down)


@runtime_checkable
class Engine(Protocol):
    """What the layers above the engine may rely on; nothing more."""

    @property
    def model_name(self) -> str: ...

    @property
    def context_size(self) -> int: ...

    def count_tokens(self, message: Mapping[str, str]) -> int:
        """Tokens one chat message takes in a prompt, its template's framing included: what the
        layers above fit a conversation's history to the context with (and store with the
        message, so it is counted once). An estimate may run high, not much low; `generate`'s own
        check of the whole prompt stays the last word. Call once the engine has started."""

    @property
    def prompt_overhead(self) -> int:
        """Tokens a prompt holds beyond its messages' counts (a BOS, a default system prompt its
        template adds, the reply's opener): an upper bound."""

    async def start(self) -> None:
        """Load the model and start the loop; returns when the engine can serve."""

    async def shutdown(self) -> None:
        """Stop admitting, end every open stream with `cancelled`, free everything."""

    def generate(
        self,
        request_id: str,
        messages: ChatMessages,
        params: SamplingParams,
        *,
        owner: str | None = None,
    ) -> AsyncIterator[EngineEvent]:
        """Validate and enqueue; call from the event loop. Raises `EngineError` on bad input.

        `owner`: whom the request is for (see the module docstring): fair admission and cache
        isolation across owners."""

    def abort(self, request_id: str) -> None:
        """Idempotent and non-blocking: the sequence ends at the next step, its KV cache freed."""

    def stats(self) -> EngineStats: ...
