"""The reply service's own refusals (app/domain/chat/replies.py), apart so that the routes and the
other services that raise them need not import the service."""

from __future__ import annotations

from app.domain.errors import DomainError


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
