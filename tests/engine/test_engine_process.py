"""ENGINE=process beyond the contract (tests/engine/test_engine_contract.py runs the contract on
it): what web workers sharing one engine process need when things go wrong. The engine process is
real (`python -m app.engine.process`, tests/engine_process.py) and serves the synthetic engine,
so that a crash and a restart take milliseconds."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.engine.base import EngineUnavailableError, FinishReason, SamplingParams, TextDelta
from app.engine.process import wire
from app.engine.process.client import EngineProcessClient
from app.settings import EngineSettings
from tests.engine.streams import collect
from tests.engine_process import EngineProcess

pytestmark = pytest.mark.live  # a process beside the tests

ENGINE_ENV = {"ENGINE": "synthetic", "SYNTHETIC_STEP_MS": "5", "SYNTHETIC_PER_SEQ_MS": "0"}
PARAMS = SamplingParams(max_tokens=2000, seed=3)


def ask(tokens: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me more. [[synthetic:tokens={tokens}]]"}]


@pytest.fixture
def engine_process(tmp_path: Path) -> Iterator[EngineProcess]:
    with EngineProcess(tmp_path / "engine.sock", ENGINE_ENV, tmp_path / "engine.log") as proc:
        yield proc


async def connect(proc: EngineProcess) -> EngineProcessClient:
    client = EngineProcessClient(
        EngineSettings(kind="process", socket_path=str(proc.socket), process_wait_s=10)
    )
    await client.start()
    return client


@pytest.fixture
async def worker(engine_process: EngineProcess) -> AsyncIterator[EngineProcessClient]:
    client = await connect(engine_process)
    yield client
    await client.shutdown()


async def test_a_crashed_engine_process_ends_open_replies_failed_and_is_used_again_once_back(
    engine_process: EngineProcess, worker: EngineProcessClient
) -> None:
    stream = worker.generate("r", ask(1500), PARAMS)
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    engine_process.kill()
    _, deltas, fin = await asyncio.wait_for(collect(stream), timeout=10)
    assert fin.reason is FinishReason.ERROR and "went away" in (fin.error or "")
    # what was delivered is counted (usage, quotas), though its engine is gone
    delivered = len(first.token_ids) + sum(len(d.token_ids) for d in deltas)
    assert fin.completion_tokens == delivered > 0
    assert fin.first_token_at is not None and fin.queued_at <= fin.first_token_at
    assert "went away" in (worker.stats().unavailable or "")
    with pytest.raises(EngineUnavailableError):
        worker.generate("s", ask(5), PARAMS)

    engine_process.start()  # the worker connects again by itself
    for _ in range(200):
        if worker.stats().unavailable is None:
            break
        await asyncio.sleep(0.05)
    text, _, fin = await collect(worker.generate("s", ask(5), PARAMS))
    assert fin.reason is FinishReason.STOP and fin.completion_tokens == 5 and text


async def test_workers_may_use_the_same_request_id(
    engine_process: EngineProcess, worker: EngineProcessClient
) -> None:
    other = await connect(engine_process)
    try:
        mine, theirs = await asyncio.gather(
            collect(worker.generate("same", ask(7), PARAMS)),
            collect(other.generate("same", ask(11), PARAMS)),
        )
    finally:
        await other.shutdown()
    assert (mine[2].completion_tokens, theirs[2].completion_tokens) == (7, 11)


async def test_a_worker_that_goes_away_has_its_requests_aborted(
    engine_process: EngineProcess, worker: EngineProcessClient
) -> None:
    leaving = await connect(engine_process)
    streams = [leaving.generate(f"r{i}", ask(1500), PARAMS) for i in range(3)]
    await anext(streams[0])
    assert worker.stats().running == 3
    leaving._writer.transport.abort()  # type: ignore[union-attr]  # as if its process died
    for _ in range(100):
        if worker.stats().running == 0:
            break
        await asyncio.sleep(0.02)
    assert worker.stats().running == 0
    await leaving.shutdown()


async def test_no_engine_process_is_a_clear_refusal_at_start(tmp_path: Path) -> None:
    client = EngineProcessClient(
        EngineSettings(kind="process", socket_path=str(tmp_path / "none.sock"), process_wait_s=0.3)
    )
    with pytest.raises(EngineUnavailableError, match="no engine process answers"):
        await client.start()
    assert client.stats().unavailable


def test_a_socket_another_user_owns_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "engine.sock"
    path.touch()
    wire.check_owner(str(path))  # ours: fine
    monkeypatch.setattr(os, "getuid", lambda: os.stat(path).st_uid + 1)
    with pytest.raises(PermissionError, match="belongs to uid"):
        wire.check_owner(str(path))


def test_the_socket_is_private(engine_process: EngineProcess) -> None:
    assert engine_process.socket.stat().st_mode & 0o777 == 0o600


async def test_sigterm_ends_the_engine_process_cleanly_under_a_connected_worker(
    engine_process: EngineProcess, worker: EngineProcessClient
) -> None:
    stream = worker.generate("r", ask(1500), PARAMS)
    await anext(stream)
    assert engine_process.stop() == 0  # SIGTERM: exits by itself (no SIGKILL after 15 s)
    _, _, fin = await asyncio.wait_for(collect(stream), timeout=10)
    assert fin.reason is FinishReason.ERROR
    assert not engine_process.socket.exists()
    assert "Traceback" not in engine_process.log_path.read_text()
