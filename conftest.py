"""Test tiers, one mark per test, given by the test's folder (registered in pyproject.toml).

- `fast`: unit and in-process tests (tests/*.py, tests/db, tests/engine, tests/streaming): no
  server process, no browser, no C++ build (`scripts/test fast`);
- `live`: real uvicorn servers in subprocesses (tests/serving), and whatever needs the compiled
  llama-server;
- `ops`: nginx, Procfile replicas, the llama-server build (tests/ops);
- `browser`: Playwright in Chromium (e2e).

A test that already carries a tier mark keeps it: tests/engine/test_engine_contract.py marks its
ENGINE=openai case `live` because it runs in front of a compiled llama-server.

This file sits at the root so that it sees e2e/ as well as tests/.
"""

from __future__ import annotations

from pathlib import Path

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
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(tier_of(item.path))
