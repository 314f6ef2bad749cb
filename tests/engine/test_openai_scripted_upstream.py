"""ENGINE=openai against an upstream that streams what the test scripts: a real HTTP server on a
local port (asyncio), for what llama-server never does — ignore `stop`, leave out `usage`, end
with an unknown finish reason, send an error chunk. The engine's guarantees must hold anyway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from app.engine import create_engine
from app.engine.base import Engine, FinishReason, SamplingParams
from app.settings import EngineSettings
from tests.engine.streams import collect

HELLO = [{"role": "user", "content": "hi"}]


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


def text(piece: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": finish}]}


class ScriptedUpstream:
    """Answers each chat request with `script(body)`'s bytes, then closes (`hang`: then keeps the
    stream open, silent, until the client goes; a `script` of None: not even the headers).

    GET `/v1/models` lists one model (`owned_by`: the server it plays); `/health` answers `health`
    (404: none offered); `/props` answers `total_slots` as llama-server does (404 when None)."""

    def __init__(
        self,
        script: Script | None,
        *,
        owned_by: str | None = None,
        health: int = 404,
        total_slots: int | None = None,
        hang: bool = False,
    ) -> None:
        self.script = script
        self.owned_by = owned_by
        self.health = health
        self.total_slots = total_slots
        self.hang = hang
        self.bodies: list[dict] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    def answer(self, path: str) -> tuple[int, dict]:
        if path == "/v1/models":
            model = {"id": "scripted", "max_model_len": 4096}
            return 200, {"data": [{**model, "owned_by": self.owned_by} if self.owned_by else model]}
        if path == "/health" and self.health != 404:
            return self.health, {"status": "ok" if self.health == 200 else "engine dead"}
        if path == "/props" and self.total_slots is not None:
            return 200, {"total_slots": self.total_slots}
        return 404, {"error": {"message": "File Not Found"}}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                if head.startswith("GET"):
                    status, answer = self.answer(head.split()[1])
                    body = json.dumps(answer)
                    writer.write(
                        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                    )
                    await writer.drain()
                    continue
                length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
                request = json.loads(await reader.readexactly(length))
                self.bodies.append(request)
                if self.script is not None:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Connection: close\r\n\r\n" + self.script(request)
                    )
                    await writer.drain()
                if self.hang or self.script is None:
                    while await reader.read(65536):  # silence until the client goes
                        pass
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


Script = Callable[[dict], bytes]
Start = Callable[..., Awaitable[tuple[Engine, "ScriptedUpstream"]]]


@pytest.fixture
async def scripted() -> AsyncIterator[Start]:
    """Start scripted upstreams (scripts, or `ScriptedUpstream`s) and an ENGINE=openai in front of
    them, with these settings; all end with the test. Returns the engine and the first upstream."""
    engines: list[Engine] = []
    servers: list[asyncio.Server] = []

    async def start(*given: Script | ScriptedUpstream, **settings: Any) -> tuple[Engine, Any]:
        upstreams = [u if isinstance(u, ScriptedUpstream) else ScriptedUpstream(u) for u in given]
        for upstream in upstreams:
            upstream.server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
            servers.append(upstream.server)
        urls = tuple(u.url for u in upstreams)
        engine = create_engine(EngineSettings(kind="openai", upstreams=urls, **settings))
        await engine.start()
        engines.append(engine)
        return engine, upstreams[0]

    yield start
    for engine in engines:
        await engine.shutdown()
    for server in servers:
        server.close()


async def test_stop_strings_hold_even_when_the_upstream_ignores_them(scripted: Start) -> None:
    pieces = ["Hel", "lo, wo", "rld", "! and more"]
    engine, upstream = await scripted(
        lambda _: sse(*(text(p) for p in pieces), text("", "length")) + b"data: [DONE]\n\n"
    )
    params = SamplingParams(max_tokens=10, stop=("o, w", "zzz"))
    shown, deltas, fin = await collect(engine.generate("r", HELLO, params))
    assert shown == "Hell" and fin.reason is FinishReason.STOP
    assert "o, w" not in "".join(d.text for d in deltas)
    assert upstream.bodies[0]["stop"] == ["o, w", "zzz"]  # asked for, not relied on
    assert (
        engine.context_size == 4096
    )  # ENGINE_CONTEXT 0 (the default): the upstream's max_model_len


async def test_without_usage_the_tokens_are_counted_and_an_unknown_end_is_an_error(
    scripted,
) -> None:  # type: ignore[no-untyped-def]
    engine, _ = await scripted(lambda _: sse(text("a"), text("b"), text("", "content_filter")))
    shown, deltas, fin = await collect(engine.generate("r", HELLO, SamplingParams()))
    assert shown == "ab" and sum(len(d.token_ids) for d in deltas) == 2
    assert fin.reason is FinishReason.ERROR and "content_filter" in (fin.error or "")
    assert (fin.completion_tokens, fin.prompt_tokens) == (2, 0)


async def test_an_error_chunk_mid_reply_ends_it_failed_with_the_text_so_far(
    scripted: Start,
) -> None:
    engine, _ = await scripted(
        lambda _: sse(text("partial"), {"error": {"message": "CUDA out of memory", "code": 500}})
    )
    shown, _, fin = await collect(engine.generate("r", HELLO, SamplingParams()))
    assert shown == "partial" and fin.reason is FinishReason.ERROR
    assert "failed mid-reply" in (fin.error or "") and "CUDA out of memory" in (fin.error or "")
    assert engine.stats().backends[0].errors == 1


async def test_a_stream_cut_before_any_text_is_retried_nowhere_else_and_fails_clearly(
    scripted: Start,
) -> None:
    engine, _ = await scripted(lambda _: b"")  # headers, then the connection closes
    shown, _, fin = await collect(engine.generate("r", HELLO, SamplingParams()))
    assert shown == "" and fin.reason is FinishReason.ERROR
    assert "no upstream could serve the request" in (fin.error or "")
    assert "without a finish reason" in (fin.error or "")


def reply(_: dict) -> bytes:
    return sse(text("Hi"), text(" there", "stop")) + b"data: [DONE]\n\n"


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the time allowed"
        await asyncio.sleep(0.01)


async def test_every_sampling_field_reaches_the_upstream_under_its_own_name(
    scripted: Start,
) -> None:
    """trtllm-serve refuses a field it does not know (`repeat_penalty`) and reads top_k 0 as no
    cut; the app's min_p and penalties reach it (llama-server: tests/serving, on its /slots)."""
    engine, upstream = await scripted(ScriptedUpstream(reply, owned_by="tensorrt_llm"))
    params = SamplingParams(
        top_k=0, min_p=0.05, frequency_penalty=0.5, presence_penalty=0.25, repeat_penalty=1.2
    )
    _, _, fin = await collect(engine.generate("r", HELLO, params))
    assert fin.reason is FinishReason.STOP
    (body,) = upstream.bodies
    assert "repeat_penalty" not in body
    fields = ("top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
    assert [body[f] for f in fields] == [0, 0.05, 0.5, 0.25, 1.2]


async def test_the_slot_count_is_read_again_at_every_health_check(scripted: Start) -> None:
    """An upstream redeployed with fewer slots is sent no more requests than it has."""
    engine, upstream = await scripted(
        ScriptedUpstream(reply, owned_by="llamacpp", total_slots=4),
        upstream_probe_interval_s=0.05,
    )
    assert engine.stats().backends[0].capacity == 4
    await collect(engine.generate("r1", HELLO, SamplingParams()))  # it has served a request
    upstream.total_slots = 1  # restarted with --parallel 1
    await wait_for(lambda: engine.stats().backends[0].capacity == 1)
    assert engine.stats().extra["upstream_slots"] == 1


async def test_a_hung_engine_that_answers_its_checks_is_avoided(scripted: Start) -> None:
    """It lists its models but never streams: after its first first-token timeout the upstream
    that produces tokens goes first, although every health check since passed. Before, a good
    check wiped the failure out and it took every other request, each waiting the full timeout.
    (Marking it down as its timeouts add up: tests/engine/test_openai_routing.py.)"""
    hung = ScriptedUpstream(None)
    engine, _ = await scripted(
        hung,
        reply,
        upstream_probe_interval_s=0.02,
        upstream_first_token_timeout_s=0.3,
        upstream_failures_to_down=2,
    )
    ends = [await collect(engine.generate(f"r{i}", HELLO, SamplingParams())) for i in range(8)]
    assert [fin.reason for _, _, fin in ends] == [FinishReason.STOP] * 8
    assert len(hung.bodies) == 1
    hung_stats = engine.stats().backends[0]
    assert "no first token within 0.3 s" in (hung_stats.last_error or "")


async def test_a_health_endpoint_that_says_unhealthy_marks_the_upstream_down(
    scripted: Start,
) -> None:
    """vLLM whose engine core died still lists its models; its /health answers 503. /readyz's
    `degraded` names it while the other serves."""
    dead = ScriptedUpstream(reply, health=503)
    engine, _ = await scripted(
        dead, ScriptedUpstream(reply, health=200), upstream_probe_interval_s=0.02
    )
    stats = engine.stats()
    assert [b.up for b in stats.backends] == [False, True] and stats.unavailable is None
    assert stats.degraded is not None and dead.url in stats.degraded
    assert "GET /health answered 503" in stats.degraded
    _, _, fin = await collect(engine.generate("r", HELLO, SamplingParams()))
    assert fin.reason is FinishReason.STOP and dead.bodies == []
    dead.health = 200  # its engine back
    await wait_for(lambda: engine.stats().degraded is None)
    assert all(b.up for b in engine.stats().backends)


async def test_silence_mid_reply_has_its_own_shorter_limit(scripted: Start) -> None:
    """A reply frozen mid-way ends failed after the stall limit, not the first token's."""
    engine, _ = await scripted(
        ScriptedUpstream(lambda _: sse(text("partial")), hang=True),
        upstream_first_token_timeout_s=30,
        upstream_stall_timeout_s=0.3,
    )
    started = asyncio.get_running_loop().time()
    shown, _, fin = await collect(engine.generate("r", HELLO, SamplingParams()))
    elapsed = asyncio.get_running_loop().time() - started
    assert shown == "partial" and fin.reason is FinishReason.ERROR
    assert "no text for 0.3 s mid-reply" in (fin.error or "")
    assert 0.3 <= elapsed < 5, elapsed
