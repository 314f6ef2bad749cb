"""ENGINE=openai: the engine contract over OpenAI-compatible inference servers (trtllm-serve,
Dynamo's frontend, vLLM, SGLang, llama.cpp's llama-server), one or several.

    ENGINE=openai ENGINE_UPSTREAMS=http://10.0.0.5:8000/v1,http://10.0.0.6:8000/v1

Each request is one asyncio task streaming `POST /chat/completions` from one upstream:

- Stop and disconnect cancel that task, which closes the upstream stream then and there (httpx
  drops a connection whose response was not read to the end: httpcore/_async/http11.py,
  `_response_closed`); the upstream sees its client gone and aborts the request. Nothing polls.
- The app keeps its own waiting queue (fair across owners, app/engine/fair_queue.py) and sends an
  upstream at most as many requests as it has slots: llama-server keeps a request it has queued
  and prefills it later even when its client has closed, so a request the app holds back is one
  Stop can drop for free.
- Routing (app/engine/openai/upstreams.py): the least-loaded upstream that is up; a failure
  before the first token fails over to another, never after one (the text would be duplicated):
  then the reply ends `error` with what it had. Health checks (app/engine/openai/health.py) and
  failed requests mark upstreams down; health checks bring them back.
- Deadlines: the first token (ENGINE_UPSTREAM_FIRST_TOKEN_TIMEOUT_S, which covers a long prompt's
  prefill), then the longest silence mid-reply (ENGINE_UPSTREAM_STALL_TIMEOUT_S, much shorter: a
  reply frozen that long is a hung server).
- Sampling fields go by each upstream's own names (app/engine/openai/sampling.py).
- The upstream's text already comes as text (llama-server never sends half a UTF-8 character:
  tools/server/server-context.cpp, `validate_utf8`), but stop strings are applied here as well,
  with the same hold-back as the local engines, for servers that do not take `stop`.
One request's state: app/engine/openai/request.py; its events: app/engine/requests.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import httpx

from app.engine.base import (
    ChatMessages,
    EngineStats,
    EngineUnavailableError,
    FinishReason,
    SamplingParams,
)
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.fair_queue import FairQueue
from app.engine.openai.health import HealthChecks, describe
from app.engine.openai.request import UpstreamRequest
from app.engine.openai.stream import (
    FINISH_REASONS,
    UpstreamProtocolError,
    chat_body,
    chunks,
    error_message,
)
from app.engine.openai.upstreams import Upstream, UpstreamPool
from app.engine.requests import TableEngine, reply_room
from app.settings import EngineSettings

log = logging.getLogger(__name__)

# No tokenizer here: a prompt is refused at once only when even at this many UTF-8 bytes per token
# (more than ordinary text's tokens hold) it would not fit; the upstream refuses the rest itself.
MAX_BYTES_PER_TOKEN = 16
# For fitting a page conversation's history (`count_tokens`), an honest estimate with a margin:
# ordinary English runs about 4 UTF-8 bytes per token in BPE vocabularies, so 3 over-counts by
# about a third; FRAMING is a chat template's per-message wrapping (ChatML's is 5 tokens). Text
# that packs fewer bytes per token (CJK, code) may still run over: the upstream's own 400 then
# says so. An upstream that reports no context is taken to hold UPSTREAM_CONTEXT.
ESTIMATE_BYTES_PER_TOKEN = 3
FRAMING = 8
UPSTREAM_CONTEXT = 8192


class _Failed(Exception):
    """This attempt failed; whether another upstream may retry depends on what was sent."""


class OpenAIRemoteEngine(TableEngine[UpstreamRequest]):
    """`Engine` over upstream OpenAI-compatible servers (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        if not settings.upstreams:
            raise ValueError("ENGINE=openai needs ENGINE_UPSTREAMS=http://host:port/v1,...")
        super().__init__()
        self._settings = settings
        self._pool = UpstreamPool(
            (
                Upstream(url, settings.upstream_slots or settings.max_seqs)
                for url in settings.upstreams
            ),
            failures_to_down=settings.upstream_failures_to_down,
        )
        self._model_name = settings.model_path or ""
        self._context_size = settings.context_size or UPSTREAM_CONTEXT
        self._waiting: FairQueue[UpstreamRequest] = FairQueue(lambda r: r.owner)
        self._client: httpx.AsyncClient | None = None
        self._health: HealthChecks | None = None
        self._prober: asyncio.Task[None] | None = None
        self._accepting = False
        self._tokens = 0
        self._failovers = 0

    # -- the contract ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name or "openai-upstream"

    @property
    def context_size(self) -> int:
        return self._context_size

    def count_tokens(self, message: Mapping[str, str]) -> int:
        """An estimate (no tokenizer here): see ESTIMATE_BYTES_PER_TOKEN."""
        size = len(str(message.get("content", "")).encode())
        return -(-size // ESTIMATE_BYTES_PER_TOKEN) + FRAMING

    @property
    def prompt_overhead(self) -> int:
        return 4 * FRAMING  # a BOS, the reply's opener, a default system prompt of its template

    async def start(self) -> None:
        if self._client is not None:
            return
        s = self._settings
        self._loop = asyncio.get_running_loop()
        headers = {"Authorization": f"Bearer {s.upstream_key}"} if s.upstream_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            # read: no limit here; a request's first token and its silences mid-reply have their
            # own deadline (_attempt), health checks theirs (health.py)
            timeout=httpx.Timeout(
                connect=s.upstream_connect_timeout_s,
                read=None,
                write=s.upstream_connect_timeout_s,
                pool=None,  # never waits: the app's own queue bounds what is sent
            ),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._health = HealthChecks(
            self._client,
            self._pool,
            timeout_s=s.upstream_connect_timeout_s,
            discover_slots=s.upstream_slots == 0,
            on_change=self._admit,  # requests wait for an upstream, or end if none is left
        )
        await self._health.check_all()
        model = self._health.model
        if model is not None:
            self._model_name = self._model_name or model.name
            # ENGINE_CONTEXT 0 (the default): the upstream's own context, as it reports it
            own = model.context or s.context_size or UPSTREAM_CONTEXT
            self._context_size = min(s.context_size or own, own)
        if not self._model_name:
            await self._client.aclose()
            self._client = None
            raise EngineUnavailableError(
                f"no model name: set MODEL_PATH, or start an upstream ({self._pool.unavailable()})"
            )
        self._accepting = True
        self._prober = asyncio.create_task(
            self._health.run_forever(s.upstream_probe_interval_s), name="openai-upstream-checks"
        )
        log.info(
            "openai engine: model %s, context %d, upstreams %s",
            self._model_name,
            self._context_size,
            ", ".join(
                f"{u.base_url} ({'up' if u.up else 'down'}, {u.capacity} slots)" for u in self._pool
            ),
        )

    async def shutdown(self) -> None:
        self._accepting = False
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.cancel()
        tasks = [r.task for r in self.requests if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *([prober] if prober else []), return_exceptions=True)
        for req in self.requests:
            self._end(req, FinishReason.CANCELLED)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _unavailable(self) -> str | None:
        if not self._accepting or self._loop is None:
            return "the openai engine is not running"
        return self._pool.unavailable()

    def _open(
        self, request_id: str, messages: ChatMessages, params: SamplingParams, owner: str | None
    ) -> UpstreamRequest:
        prompt_bytes = sum(len(str(m.get("content", "")).encode()) for m in messages)
        reply_room(-(-prompt_bytes // MAX_BYTES_PER_TOKEN), self._context_size, params)
        return UpstreamRequest(
            request_id=request_id,
            body=chat_body(self._model_name, messages, params),
            params=params,
            owner=owner,
            detok=IncrementalDetokenizer(stop=params.stop),
        )

    def _submit(self, req: UpstreamRequest) -> None:
        assert self._loop is not None
        req.task = self._loop.create_task(self._serve(req), name=f"openai-{req.request_id}")
        # A task cancelled before it ever ran never runs its body: end the request here then.
        req.task.add_done_callback(lambda _: self._end(req, FinishReason.CANCELLED))

    def _abort(self, req: UpstreamRequest) -> None:
        if req.task is not None:
            req.task.cancel()  # the upstream stream closes as the task unwinds

    def stats(self) -> EngineStats:
        running = self._pool.in_flight
        return EngineStats(
            running=running,
            waiting=len(self.requests) - running,
            kv_used=0,  # the upstreams' own business
            kv_total=0,
            steps=0,
            tokens_generated=self._tokens,
            extra={
                "upstreams_up": sum(u.up for u in self._pool),
                "upstream_slots": self._pool.capacity,
                "failovers": self._failovers,
            },
            backends=tuple(u.stats() for u in self._pool),
            unavailable=self._pool.unavailable(),
            degraded=self._pool.degraded(),
        )

    # -- one request ----------------------------------------------------------------------------

    async def _serve(self, req: UpstreamRequest) -> None:
        reason, error = FinishReason.ERROR, "the request ended unexpectedly"
        try:
            reason, error = await self._attempts(req)
        except asyncio.CancelledError:
            reason, error = FinishReason.CANCELLED, None
        except Exception as exc:  # a bug here must not leave the stream hanging
            log.exception("openai engine: request %s failed", req.request_id)
            reason, error = FinishReason.ERROR, f"the openai engine failed: {describe(exc)}"
        finally:
            self._end(req, reason, error)

    async def _attempts(self, req: UpstreamRequest) -> tuple[FinishReason, str | None]:
        """Try upstreams until one serves the request, or one fails after the first token."""
        while True:
            upstream = await self._admission(req)
            if upstream is None:
                tried = "; ".join(req.failures) or self._pool.unavailable() or "none is up"
                return FinishReason.ERROR, f"no upstream could serve the request: {tried}"
            try:
                return await self._attempt(req, upstream)
            except _Failed as exc:
                upstream.errors += 1
                if self._pool.request_failed(upstream, str(exc)):
                    log.warning("upstream %s marked down: %s", upstream.base_url, exc)
                    self._admit()
                self._release(req)
                if req.completion_tokens:  # text went out: a retry would repeat it
                    return (
                        FinishReason.ERROR,
                        f"upstream {upstream.base_url} failed mid-reply: {exc}",
                    )
                req.failures.append(f"{upstream.base_url}: {exc}")
                self._failovers += 1
                log.info(
                    "request %s fails over from %s: %s", req.request_id, upstream.base_url, exc
                )

    async def _admission(self, req: UpstreamRequest) -> Upstream | None:
        """Wait in the fair queue for a free slot on an upstream not tried yet (None: none left)."""
        assert self._loop is not None
        req.admitted = self._loop.create_future()
        self._waiting.append(req)
        self._admit()
        return await req.admitted

    def _admit(self) -> None:
        """Hand free upstream slots to the requests due, in the fair queue's order."""
        while self._waiting:
            head = self._waiting.peek()
            assert head is not None and head.admitted is not None
            if head.admitted.done():  # cancelled: its task has yet to run its cleanup
                self._waiting.remove(head)
                continue
            if not self._pool.any_up(exclude=head.tried):
                self._waiting.remove(head)
                head.admitted.set_result(None)
                continue
            upstream = self._pool.pick(exclude=head.tried)
            if upstream is None:
                return  # nobody overtakes the request due
            self._waiting.pop()
            upstream.in_flight += 1
            head.upstream = upstream
            head.tried.append(upstream)
            head.admitted_at = head.admitted_at or time.time()
            head.admitted.set_result(upstream)

    def _release(self, req: UpstreamRequest) -> None:
        """The request leaves its upstream slot or the queue; the next one due may go."""
        if req.upstream is not None:
            req.upstream.in_flight -= 1
            req.upstream = None
            self._waiting.done(req)
            self._admit()
        elif req in self._waiting:
            self._waiting.remove(req)

    async def _attempt(
        self, req: UpstreamRequest, upstream: Upstream
    ) -> tuple[FinishReason, str | None]:
        """Stream the reply from `upstream`; raises `_Failed` when the upstream fails."""
        assert self._client is not None and self._loop is not None
        s = self._settings
        upstream.requests += 1
        sent_at = time.monotonic()
        finish: str | None = None
        try:
            # One deadline: the first token's, then from each chunk with text the longest silence
            # mid-reply (a role-only first chunk, as vLLM sends at once, does not count).
            async with asyncio.timeout(s.upstream_first_token_timeout_s) as deadline:
                async with self._client.stream(
                    "POST", f"{upstream.base_url}/chat/completions", json=req.body_for(upstream)
                ) as response:
                    if response.status_code != 200:
                        message = error_message(await response.aread())
                        if response.status_code >= 500 or response.status_code == 429:
                            raise _Failed(f"HTTP {response.status_code}: {message}")
                        upstream.errors += 1  # a refusal of this request, not a failing server
                        return FinishReason.ERROR, f"the upstream refused the request: {message}"
                    async for chunk in chunks(response):
                        if chunk.text:
                            if not req.completion_tokens:
                                upstream.record_ttft(time.monotonic() - sent_at)
                                self._pool.producing(upstream)
                            deadline.reschedule(self._loop.time() + s.upstream_stall_timeout_s)
                            self._tokens += 1
                            if req.take_text(chunk.text, time.time()):
                                return FinishReason.STOP, None  # leaving closes the stream
                        finish = chunk.finish_reason or finish
                        req.usage = chunk.usage or req.usage
        except TimeoutError as exc:
            if req.completion_tokens:
                raise _Failed(f"no text for {s.upstream_stall_timeout_s:g} s mid-reply") from exc
            raise _Failed(f"no first token within {s.upstream_first_token_timeout_s:g} s") from exc
        except (httpx.TransportError, UpstreamProtocolError) as exc:
            raise _Failed(describe(exc)) from exc
        if finish is None:
            raise _Failed("the stream ended without a finish reason")
        self._pool.producing(upstream)  # a reply may end without text
        reason = FINISH_REASONS.get(finish)
        if reason is None:
            return FinishReason.ERROR, f"the upstream ended the reply with {finish!r}"
        return reason, None

    def _end(self, req: UpstreamRequest, reason: FinishReason, error: str | None = None) -> None:
        """Free what the request holds and push its one `Finished` (idempotent)."""
        if req.done:
            return
        self._release(req)
        if req.admitted is not None and not req.admitted.done():
            req.admitted.cancel()
        req.take_usage()
        req.finish(reason, error)
