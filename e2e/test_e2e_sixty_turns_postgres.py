"""Issue 22's 60-turn conversation through the page on PostgreSQL: test_e2e_sixty_turns.py's
test and settings, with the server on a throwaway PostgreSQL database (made for this module,
dropped after it)."""

from __future__ import annotations

import pytest

from e2e.test_e2e_sixty_turns import server_env_overrides, test_sixty_turns_through_the_page

__all__ = ["server_env_overrides", "test_sixty_turns_through_the_page"]


@pytest.fixture(scope="module")
def backend() -> str:
    return "postgresql"


@pytest.fixture(autouse=True)
def _on_postgresql(database_url: str) -> None:
    assert database_url.startswith("postgresql+asyncpg://"), database_url
