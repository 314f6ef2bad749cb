"""The context window (app/domain/chat/prompts/window.py) against the running engine: a branch
fitted for a reply, and what the composer may send next."""

from __future__ import annotations

from uuid import UUID

from app.db.session import Sessions
from app.domain.chat.prompts import window as context_window
from app.domain.chat.prompts.turns import Branch
from app.domain.chat.prompts.window import Fitted, Room
from app.domain.chat.replies.limits import ReplyLimits
from app.domain.chat.schemas import ContextLimits, ReplyOptions
from app.domain.chat.settings import service as chat_settings
from app.domain.errors import InvalidInputError, UnavailableError
from app.engine.base import Engine, EngineUnavailableError, SamplingParams


def room_for(engine: Engine, params: SamplingParams) -> Room:
    return Room(engine.context_size, params.max_tokens, engine.prompt_overhead)


def fit_branch(
    engine: Engine, branch: Branch, system_prompt: str, params: SamplingParams
) -> Fitted:
    """`branch` fitted to the engine's context, leaving the reply its max_tokens. Raises
    context_window.MessageTooLongError, UnavailableError."""
    try:
        return context_window.fit(
            branch.history,
            branch.question,
            system_prompt=system_prompt,
            room=room_for(engine, params),
            count=engine.count_tokens,
            previous_start=branch.previous_start,
        )
    except EngineUnavailableError as exc:  # not started, or shutting down
        raise UnavailableError(str(exc)) from exc


async def context_limits(
    sessions: Sessions, engine: Engine, limits: ReplyLimits, conversation_id: UUID
) -> ContextLimits | None:
    """The context, the reply's reserve and the longest message that fits for the conversation's
    next turn, with its settings (None while the engine cannot count, or the settings no longer
    fit the context: a send then says why)."""
    chosen = await chat_settings.for_conversation(sessions, conversation_id)
    options = chat_settings.turn_options(ReplyOptions(), chosen)
    try:  # settings stored under a larger context may no longer be valid: no limits to give
        params = limits.sampling(options, engine.context_size)
    except InvalidInputError:
        return None
    room = room_for(engine, params)
    try:
        system = chosen.system_prompt
        system_tokens = (
            engine.count_tokens({"role": "system", "content": system}) if system.strip() else 0
        )
    except EngineUnavailableError:
        return None
    return ContextLimits(room.context, room.reply, room.for_messages(system_tokens))
