"""The base of the domain's own refusals that no more specific class names."""

from __future__ import annotations


class InvalidInputError(ValueError):
    """A request's value the domain refuses (out of range, not storable...): the client's fault.

    A ValueError, so callers that catch ValueError keep working; a plain ValueError elsewhere is a
    bug, and stays one (a 500). `field` names the request field at fault, when one is (`/v1`
    reports it as OpenAI's `param`)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotLoggedInError(PermissionError):
    """The request's session names no user (any more): the account was deleted since. For the
    routes whose own query checks the user instead of a separate read (ReplyService.send)."""
