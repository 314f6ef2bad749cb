"""llama.cpp's own `llama-server`, built from the installed llama-cpp-python's source.

tests/llama_cpp_build.py builds it once per machine and version (minutes on two cores; cached in
~/.cache/streamchat, so later runs start at once) and tests/llama_server.py launches it with the
app's model: what bench/vs_llama_server.py compares against and what an `ENGINE=openai` upstream
(issue 13) will be. These tests check that the two work, and the one behaviour the app will rely
on: a client that closes its stream frees the slot, as llama-server's own `/slots` shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from tests.llama_cpp_build import cache_root, llama_cpp_binaries
from tests.llama_server import LlamaServer

# The first run on a machine builds llama.cpp inside whichever test comes first (8 min with -j2
# on the 2-CPU development box); pytest's default 300 s would cut it off.
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    server = LlamaServer(log, parallel=2, slot_context=1024, threads=1)
    with server:
        yield server


def chat(max_tokens: int) -> dict[str, object]:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def wait_idle(server: LlamaServer, timeout_s: float) -> float:
    """Seconds until no slot is processing; fails after `timeout_s`."""
    started = time.monotonic()
    while server.busy_slots():
        assert time.monotonic() - started < timeout_s, f"slots still busy: {server.slots()}"
        time.sleep(0.02)
    return time.monotonic() - started


def test_the_build_is_cached_outside_the_repository_for_the_installed_version() -> None:
    binaries = llama_cpp_binaries()
    assert binaries.version == metadata.version("llama-cpp-python")
    assert binaries.server.is_relative_to(cache_root())
    assert not binaries.server.is_relative_to(Path(__file__).resolve().parents[2])
    started = time.monotonic()
    assert llama_cpp_binaries() == binaries
    assert time.monotonic() - started < 1  # cached: no second build


def test_it_streams_a_chat_completion_and_its_slot_goes_idle(llama_server: LlamaServer) -> None:
    texts, usage, finish = [], None, None
    with httpx.stream(
        "POST", f"{llama_server.openai_url}/chat/completions", json=chat(8), timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk["choices"]:
                texts.append(choice["delta"].get("content") or "")
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    assert "".join(texts).strip()
    assert finish == "length"
    assert usage is not None and usage["completion_tokens"] == 8
    wait_idle(llama_server, timeout_s=2)
    assert llama_server.metrics()["llamacpp:requests_processing"] == 0


def test_a_client_closing_its_stream_mid_reply_frees_the_slot(llama_server: LlamaServer) -> None:
    """The slot is busy while the reply streams, and idle soon after the client hangs up: what
    Stop in front of an upstream llama-server (issue 13) relies on. Without the hang-up the reply
    would run to 600 tokens (tens of seconds on one thread)."""
    with httpx.stream(
        "POST", f"{llama_server.openai_url}/chat/completions", json=chat(600), timeout=60
    ) as response:
        lines = response.iter_lines()
        received = 0
        while received < 3:
            received += next(lines).startswith("data: ")
        assert llama_server.busy_slots() == 1
    freed_in_s = wait_idle(llama_server, timeout_s=2)
    assert freed_in_s < 2
