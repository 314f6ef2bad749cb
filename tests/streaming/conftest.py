"""Fixtures for the streaming core's in-process tests (helpers: tests/streaming/core.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.engine.synthetic.engine import SyntheticEngine
from app.streaming.manager import GenerationManager
from tests.streaming.core import MemoryLedger, engine_settings


@pytest.fixture
async def engine() -> AsyncIterator[SyntheticEngine]:
    eng = SyntheticEngine(engine_settings())
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()


@pytest.fixture
def ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture
async def make_manager(
    engine: SyntheticEngine, ledger: MemoryLedger
) -> AsyncIterator[Callable[..., Awaitable[GenerationManager]]]:
    """A started manager over the engine and ledger; background duties off unless asked for."""
    made: list[GenerationManager] = []

    async def make(**settings: float) -> GenerationManager:
        settings.setdefault("flush_interval_s", 3600.0)
        settings.setdefault("client_deadline_s", 3600.0)
        mgr = GenerationManager(engine, ledger, **settings)
        await mgr.start()
        made.append(mgr)
        return mgr

    yield make
    ledger.gate.set()  # a test that stalled the database lets the shutdown save
    for mgr in made:
        await mgr.shutdown(timeout_s=5)


@pytest.fixture
async def manager(make_manager: Callable[..., Awaitable[GenerationManager]]) -> GenerationManager:
    return await make_manager()
