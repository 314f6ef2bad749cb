"""A reply's start, owned by the manager (`GenerationManager.start_reply`): the engine accepts the
prompt, the caller's rows are written, and only then does the reply go live. Real manager,
synthetic engine, the in-memory ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from app.engine.base import EngineError, SamplingParams
from app.engine.synthetic.engine import SyntheticEngine
from app.streaming.manager import GenerationManager, ReplyRequest, ReplyRows
from tests.streaming.core import MemoryLedger, ended


def request(content: str, max_tokens: int = 50) -> ReplyRequest:
    return ReplyRequest(
        messages=[{"role": "user", "content": content}],
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        user_id="user-1",
        source="api",
        grace_s=0.0,
    )


async def test_the_rows_are_written_with_the_engine_request_id_then_the_reply_goes_live(
    manager: GenerationManager,
) -> None:
    written: list[str] = []

    async def persist(request_id: str) -> ReplyRows:
        assert manager.live() == []  # not live before its rows are
        written.append(request_id)
        return ReplyRows("m-1", "c-1", "q-1")

    generation = await manager.start_reply(request("hi [[synthetic:tokens=5]]"), persist)
    assert manager.get("m-1") is generation
    assert (generation.request_id, generation.conversation_id) == (written[0], "c-1")
    assert (generation.user_message_id, generation.user_id, generation.source) == (
        "q-1",
        "user-1",
        "api",
    )
    assert (await ended(generation)).text


async def test_a_prompt_the_engine_refuses_writes_nothing(manager: GenerationManager) -> None:
    persisted = False

    async def persist(request_id: str) -> ReplyRows:
        nonlocal persisted
        persisted = True
        return ReplyRows("m-1", "c-1", "q-1")

    with pytest.raises(EngineError):
        await manager.start_reply(request("x " * 20_000, max_tokens=1), persist)
    assert not persisted and manager.live() == []


async def test_a_failed_write_aborts_the_engine_request(
    manager: GenerationManager, engine: SyntheticEngine
) -> None:
    async def persist(request_id: str) -> ReplyRows:
        assert engine.stats().running + engine.stats().waiting == 1
        raise ConnectionError("database unavailable (injected)")

    with pytest.raises(ConnectionError):
        await manager.start_reply(request("hi [[synthetic:tokens=5000]]"), persist)
    assert manager.live() == []
    for _ in range(200):  # the engine reaps the aborted sequence at its next step
        if engine.stats().running + engine.stats().waiting == 0:
            break
        await asyncio.sleep(0.005)
    assert engine.stats().running + engine.stats().waiting == 0


async def test_starting_closes_what_a_previous_run_left_streaming(
    ledger: MemoryLedger, make_manager: Callable[..., Awaitable[GenerationManager]]
) -> None:
    ledger.interrupted = 2
    await make_manager()
    assert ledger.interrupted == 0  # asked once, before serving
