"""ENGINE=openai against an upstream that streams what the test scripts: a real HTTP server on a
local port (asyncio), for what llama-server never does — ignore `stop`, leave out `usage`, end
with an unknown finish reason, send an error chunk. The engine's guarantees must hold anyway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

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
    """Answers GET /v1/models, and each chat request with `script(body)`'s bytes, then closes."""

    def __init__(self, script: Callable[[dict], bytes]) -> None:
        self.script = script
        self.bodies: list[dict] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                if head.startswith("GET"):
                    body = json.dumps({"data": [{"id": "scripted", "max_model_len": 4096}]})
                    writer.write(
                        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                    )
                    await writer.drain()
                    continue
                length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
                request = json.loads(await reader.readexactly(length))
                self.bodies.append(request)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                    + self.script(request)
                )
                await writer.drain()
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


Script = Callable[[dict], bytes]
Start = Callable[[Script], Awaitable[tuple[Engine, "ScriptedUpstream"]]]


@pytest.fixture
async def scripted() -> AsyncIterator[Start]:
    """Start a scripted upstream and an ENGINE=openai in front of it; both end with the test."""
    engines: list[Engine] = []
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> tuple[Engine, ScriptedUpstream]:
        upstream = ScriptedUpstream(script)
        upstream.server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        servers.append(upstream.server)
        engine = create_engine(EngineSettings(kind="openai", upstreams=(upstream.url,)))
        await engine.start()
        engines.append(engine)
        return engine, upstream

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
    assert engine.context_size == 2048  # ENGINE_CONTEXT, under the upstream's max_model_len


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
