"""Test tiers, one mark per test, given by the test's folder (registered in pyproject.toml).

- `fast`: unit and in-process tests (tests/*.py, tests/db, tests/engine, tests/streaming): no
  server process, no browser, no C++ build (`scripts/test fast`);
- `live`: real uvicorn servers in subprocesses (tests/serving), and whatever needs the compiled
  llama-server;
- `ops`: nginx, Procfile replicas, the llama-server build (tests/ops);
- `browser`: Playwright in Chromium (e2e).

A test that already carries a tier mark keeps it: tests/engine/test_engine_contract.py marks its
ENGINE=openai case `live` because it runs in front of a compiled llama-server, and its
ENGINE=process case (like tests/engine/test_engine_process.py) because an engine process runs
beside it.

Under pytest-xdist with `--dist loadfile` (the live tier, scripts/test) the slowest files are handed
out first (`SLOWEST_FIRST`), so that the workers finish together.

This file sits at the root so that it sees e2e/ as well as tests/.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

TIERS = ("fast", "live", "ops", "browser")
ROOT = Path(__file__).parent
BY_FOLDER = {
    ROOT / "tests" / "serving": "live",
    ROOT / "tests" / "ops": "ops",
    ROOT / "e2e": "browser",
}


def tier_of(path: Path) -> str:
    for folder, tier in BY_FOLDER.items():
        if path.is_relative_to(folder):
            return tier
    return "fast"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(tier_of(item.path))
    # On an xdist worker: how the controller hands files out (see `pytest_configure_node`).
    if getattr(config, "workerinput", {}).get("dist") in ("loadfile", "loadscope"):
        slowest_first(items)


# The live tier runs on xdist workers a file at a time (`-n 2 --dist loadfile`, scripts/test), each
# file going to whichever worker is free. A long file handed out last keeps one worker busy long
# after the other has finished, so the longest go first, in this order (one worker's seconds for
# each, setups included, in a live tier of 400 s on a shared 2-core machine; the tier's other
# files took 25 s or less each).
SLOWEST_FIRST = [
    "tests/serving/test_live_db_stall.py",  # 122
    "tests/serving/test_live_bad_input.py",  # 74
    "tests/serving/test_live_context_window.py",  # 66
    "tests/serving/test_live_security.py",  # 59
    "tests/serving/test_api_fuzz.py",  # 48
    "tests/serving/test_live_write_bursts.py",  # 39
    "tests/serving/test_live_sign_out.py",  # 32
    "tests/serving/test_live_storage_full.py",  # 30
    "tests/serving/test_live_isolation.py",  # 28
    "tests/serving/test_live_websocket.py",  # 27
    "tests/serving/test_live_page_stream.py",  # 27
]


def slowest_first(items: list[pytest.Item]) -> None:
    """SLOWEST_FIRST's files first, then the others by their number of tests (what xdist's own
    --loadscope-reorder goes by, turned off in `pytest_configure` so that this order holds);
    the tests of a file keep their order."""
    rank = {ROOT / name: number for number, name in enumerate(SLOWEST_FIRST)}
    counts = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), -counts[item.path]))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's, read by its scheduler
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, in the controller
def pytest_configure_node(node: Any) -> None:
    node.workerinput["dist"] = node.config.getoption("dist")  # workers see "no" in their own
