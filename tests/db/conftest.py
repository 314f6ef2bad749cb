"""Fixtures of the chat database tests: an owner and one of their conversations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from app.domain.accounts.models import User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, ConversationSource
from tests.db.chat_rows import Sessions


@pytest.fixture
async def owner(make_user: Callable[..., Awaitable[User]]) -> User:
    return await make_user("owner@example.com")


@pytest.fixture
async def conversation(db_sessions: Sessions, owner: User) -> Conversation:
    return await conversations.create_conversation(
        db_sessions, owner.id, "Hello", ConversationSource.PAGE
    )
