"""One map from the domain's errors to what they mean for a client: an HTTP status and a message.

Every transport uses it, each in one place: the app factory's exception handlers for HTTP
(app/web/errors.py), `/v1`'s router-level handler for OpenAI's error shape
(app/domain/openai/errors.py), and the WebSocket's `rejected` frame (app/domain/chat/websocket.py).
No handler catches a domain error to translate it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.domain.accounts.passwords import WeakPasswordError
from app.domain.accounts.ratelimit import TooManyAttemptsError
from app.domain.accounts.service import EmailTakenError, InvalidEmailError
from app.domain.chat.branches import NotEditableError, UnknownBranchError
from app.domain.chat.conversations import ConversationNotFoundError
from app.domain.chat.replies import NotFoundError, TooManyRepliesError
from app.domain.chat.reply_rows import NotRegenerableError
from app.domain.errors import InvalidInputError, NotLoggedInError
from app.engine.base import EngineError, EngineUnavailableError


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def _too_many_attempts(exc: TooManyAttemptsError) -> Refusal:
    return Refusal(
        429,
        "too many attempts: try again shortly",
        {"Retry-After": str(math.ceil(exc.retry_after_s))},
    )


# Most specific first: the first class the error is an instance of decides.
REFUSALS: tuple[tuple[type[Exception], Callable[[Any], Refusal]], ...] = (
    (NotFoundError, lambda exc: Refusal(404, "no such message")),
    (ConversationNotFoundError, lambda exc: Refusal(404, "no such conversation")),
    (NotRegenerableError, lambda exc: Refusal(409, str(exc))),
    (NotEditableError, lambda exc: Refusal(409, str(exc))),
    (UnknownBranchError, lambda exc: Refusal(404, "no such message in this conversation")),
    (TooManyRepliesError, lambda exc: Refusal(429, str(exc))),
    (EngineUnavailableError, lambda exc: Refusal(503, str(exc))),
    (EngineError, lambda exc: Refusal(400, str(exc))),
    (EmailTakenError, lambda exc: Refusal(409, "an account with this email already exists")),
    (WeakPasswordError, lambda exc: Refusal(400, str(exc))),
    (InvalidEmailError, lambda exc: Refusal(400, str(exc))),
    (TooManyAttemptsError, _too_many_attempts),
    (InvalidInputError, lambda exc: Refusal(400, str(exc))),
    (NotLoggedInError, lambda exc: Refusal(401, "log in first")),
)
DOMAIN_ERRORS: tuple[type[Exception], ...] = tuple(cls for cls, _ in REFUSALS)


def refusal_for(exc: BaseException) -> Refusal | None:
    """What a domain error means for the client; None for anything else (a bug: a 500)."""
    for cls, make in REFUSALS:
        if isinstance(exc, cls):
            return make(exc)
    return None
