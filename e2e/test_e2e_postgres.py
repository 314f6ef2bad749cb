"""Stop on PostgreSQL: the same page, model and checks as on SQLite (test_e2e_chat.py), with the
server on a throwaway PostgreSQL database (created for this module, dropped after it)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.conftest import User
from e2e.helpers import ChatPage, stop_mid_reply_then_reload


@pytest.fixture(scope="module")
def backend() -> str:
    return "postgresql"


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_stop_mid_reply_then_reload_on_postgresql(
    new_user: Callable[..., User], admin: User, database_url: str, transport: str
) -> None:
    assert database_url.startswith("postgresql+asyncpg://")
    chat = ChatPage(new_user().page)
    stop_mid_reply_then_reload(chat, admin.context.request, database_url, transport)
