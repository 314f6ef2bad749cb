"""The domain's refusals: one base class, each subclass carrying what it means for a client.

A `DomainError` is a request the domain refuses, the client's fault or the server's state: its
`status` (an HTTP status) and `public_message` (what the client may read) are all that every
transport needs: the app's exception handlers (app/web/errors.py), `/v1`'s error shape
(app/domain/openai/errors.py), the WebSocket's `rejected` frame (app/domain/chat/websocket.py)
and the routes' `raises=` lists (app/domain/refusals.py). Anything else that escapes is a bug:
a 500. Each class keeps its builtin base too (ValueError, LookupError...), so callers that catch
those keep working.
"""

from __future__ import annotations

from typing import ClassVar


class DomainError(Exception):
    status: ClassVar[int] = 400
    message: ClassVar[str | None] = None
    """What the client reads; None: the error's own text, written for the user."""

    @property
    def public_message(self) -> str:
        return self.message if self.message is not None else str(self)

    @property
    def headers(self) -> dict[str, str]:
        return {}


class InvalidInputError(DomainError, ValueError):
    """A request's value the domain refuses (out of range, not storable...): the client's fault.

    A ValueError, so callers that catch ValueError keep working; a plain ValueError elsewhere is a
    bug, and stays one (a 500). `field` names the request field at fault, when one is (`/v1`
    reports it as OpenAI's `param`)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotLoggedInError(DomainError, PermissionError):
    """The request's session names no user (any more): the account was deleted since. For the
    routes whose own query checks the user instead of a separate read (ReplyService.send)."""

    status = 401
    message = "log in first"


class EngineRefusedError(DomainError):
    """The engine cannot serve this prompt (too long for its context...): its message says why.
    The engine's own errors know nothing of clients; ReplyService turns them into these."""


class ContextLengthExceededError(EngineRefusedError):
    """The prompt does not fit the model's context (with room for one reply token), or is longer
    than the engine takes in one prompt (`reply_room` False): nothing was cut to make it fit.
    `/v1` answers it as OpenAI does (`code: "context_length_exceeded"`)."""

    def __init__(self, message: str, prompt_tokens: int, limit: int, *, reply_room: bool) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.reply_room = reply_room


class UnavailableError(DomainError):
    """The server is not taking replies now (not started, shutting down): try again shortly."""

    status = 503


class SessionStoreUnavailableError(UnavailableError):
    """The shared session store (SESSION_STORE_URL's Redis) cannot be reached: no session can be
    read or written and no log-in attempt counted, so the request is refused (limits fail
    closed), not guessed at."""

    message = "the session store is unreachable: try again in a moment"
    retry_after_s = 5

    def __init__(self) -> None:
        super().__init__(self.message)

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}
