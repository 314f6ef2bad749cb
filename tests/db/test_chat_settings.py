"""Per-conversation settings and users' defaults, on real SQLite and PostgreSQL (migration 0006)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from app.domain.accounts.models import User
from app.domain.chat.conversations import store as conversations
from app.domain.chat.models import Conversation, ConversationSource
from app.domain.chat.prompts import turns as prompts
from app.domain.chat.replies.limits import MODEL_DEFAULTS, ReplyLimits
from app.domain.chat.schemas import ReplyOptions
from app.domain.chat.settings import service as chat_settings
from app.domain.chat.settings.schemas import ChatSettings
from app.domain.errors import InvalidInputError
from tests.db.chat_rows import Sessions

LIMITS = ReplyLimits(default_max_tokens=512, max_message_chars=100)
CHOSEN = ChatSettings(
    system_prompt="You are a pirate.",
    temperature=0.9,
    top_p=0.8,
    max_tokens=64,
    stop=["END"],
    min_p=0.1,
    frequency_penalty=0.5,
    presence_penalty=-0.5,
    repeat_penalty=1.2,
)


async def test_a_conversation_without_settings_has_the_defaults(
    db_sessions: Sessions, conversation: Conversation
) -> None:
    chosen = await chat_settings.for_conversation(db_sessions, conversation.id)
    assert chosen == ChatSettings()
    params = LIMITS.sampling(chat_settings.turn_options(ReplyOptions(), chosen), 2048)
    assert (params.temperature, params.top_p, params.min_p) == (
        MODEL_DEFAULTS.temperature,
        MODEL_DEFAULTS.top_p,
        MODEL_DEFAULTS.min_p,
    )
    assert params.max_tokens == LIMITS.default_max_tokens


async def test_saved_settings_come_back_and_apply_under_the_request(
    db_sessions: Sessions, conversation: Conversation, owner: User
) -> None:
    await chat_settings.save_for_conversation(db_sessions, owner.id, conversation.id, CHOSEN)
    chosen = await chat_settings.for_conversation(db_sessions, conversation.id)
    assert chosen == CHOSEN
    params = LIMITS.sampling(chat_settings.turn_options(ReplyOptions(), chosen), 2048)
    assert (params.temperature, params.top_p, params.max_tokens, params.stop) == (
        0.9,
        0.8,
        64,
        ("END",),
    )
    assert (params.min_p, params.frequency_penalty, params.presence_penalty) == (0.1, 0.5, -0.5)
    assert params.repeat_penalty == 1.2
    # a request's own field wins over the conversation's, the rest still come from it
    request = ReplyOptions(temperature=0.0)
    params = LIMITS.sampling(chat_settings.turn_options(request, chosen), 2048)
    assert (params.temperature, params.top_p) == (0.0, 0.8)

    # saving again replaces every field: one left out goes back to the default
    await chat_settings.save_for_conversation(
        db_sessions, owner.id, conversation.id, ChatSettings(temperature=0.3)
    )
    assert await chat_settings.for_conversation(db_sessions, conversation.id) == ChatSettings(
        temperature=0.3
    )


async def test_another_users_conversation_is_not_found(
    db_sessions: Sessions,
    conversation: Conversation,
    make_user: Callable[..., Awaitable[User]],
) -> None:
    stranger = await make_user("stranger@example.com")
    with pytest.raises(conversations.ConversationNotFoundError):
        await chat_settings.save_for_conversation(db_sessions, stranger.id, conversation.id, CHOSEN)
    with pytest.raises(conversations.ConversationNotFoundError):
        await chat_settings.for_users_conversation(db_sessions, stranger.id, conversation.id)
    assert await chat_settings.for_conversation(db_sessions, conversation.id) == ChatSettings()


async def test_new_page_conversations_start_from_the_users_defaults(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    """A copy: changing the defaults later leaves the conversations made before alone; API
    conversations (the client sends its own messages) take none."""
    assert await chat_settings.user_defaults(db_sessions, owner.id) == ChatSettings()
    await chat_settings.save_user_defaults(db_sessions, owner.id, CHOSEN)
    assert await chat_settings.user_defaults(db_sessions, owner.id) == CHOSEN

    new = await conversations.create_conversation(db_sessions, owner.id, "after")
    api = await conversations.create_conversation(db_sessions, owner.id, "api", "api")
    assert new.source is ConversationSource.PAGE
    assert await chat_settings.for_conversation(db_sessions, new.id) == CHOSEN
    assert await chat_settings.for_conversation(db_sessions, api.id) == ChatSettings()
    assert await chat_settings.for_conversation(db_sessions, conversation.id) == ChatSettings()

    await chat_settings.save_user_defaults(db_sessions, owner.id, ChatSettings(top_p=0.5))
    assert await chat_settings.for_conversation(db_sessions, new.id) == CHOSEN


async def test_settings_go_with_their_conversation(
    db_sessions: Sessions, owner: User, conversation: Conversation
) -> None:
    await chat_settings.save_for_conversation(db_sessions, owner.id, conversation.id, CHOSEN)
    assert await conversations.delete_conversation(db_sessions, owner.id, conversation.id)
    assert await chat_settings.for_conversation(db_sessions, conversation.id) == ChatSettings()


@pytest.mark.parametrize(
    "bad",
    [
        ChatSettings(temperature=3.0),
        ChatSettings(top_p=0.0),
        ChatSettings(max_tokens=0),
        ChatSettings(max_tokens=5000),
        ChatSettings(min_p=1.5),
        ChatSettings(frequency_penalty=-2.5),
        ChatSettings(presence_penalty=2.5),
        ChatSettings(repeat_penalty=0.0),
        ChatSettings(stop=["a", "b", "c", "d", "e"]),
        ChatSettings(stop=[""]),
        ChatSettings(system_prompt="x" * 101),
    ],
)
def test_settings_are_checked_like_a_requests_fields(bad: ChatSettings) -> None:
    with pytest.raises(InvalidInputError):
        chat_settings.checked(bad, LIMITS, context_size=2048)


def test_the_system_prompt_goes_first() -> None:
    turn = [{"role": "user", "content": "hi"}]
    assert prompts.with_system_prompt("", turn) == turn
    assert prompts.with_system_prompt("  ", turn) == turn
    assert prompts.with_system_prompt("Be brief.", turn) == [
        {"role": "system", "content": "Be brief."},
        *turn,
    ]
