"""The reply service's own refusals (app/domain/chat/replies/service.py), apart so that the routes and the
other services that raise them need not import the service."""

from __future__ import annotations

from app.domain.chat.prompts.window import MessageTooLongError
from app.domain.errors import DomainError, EngineRefusedError, InvalidInputError, UnavailableError
from app.domain.quotas.service import QuotaExceededError


class NotFoundError(DomainError, LookupError):
    """No such conversation or message for this user (foreign ids look exactly like missing ones)."""

    status = 404
    message = "no such message"


class TooManyRepliesError(DomainError):
    """The user already has as many replies streaming (or queued) here as one user may."""

    status = 429

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"you already have {limit} replies in progress, the most one user may have at once: "
            f"wait for one to finish (or stop one) and send again"
        )


START_REFUSALS: tuple[type[DomainError], ...] = (
    InvalidInputError,  # the message or the sampling settings (ReplyLimits)
    MessageTooLongError,  # the question does not fit the context with the reply's room
    EngineRefusedError,  # the engine would not take the prompt
    TooManyRepliesError,
    QuotaExceededError,
    UnavailableError,  # the engine or the server is not taking replies now
)
"""What starting any reply (a send, a regeneration, an edit) may be refused with, before anything
is written (`ReplyService._launch` and the checks before it); each start has its own besides."""
