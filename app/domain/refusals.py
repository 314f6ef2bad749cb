"""What the domain's errors mean for a client, read off their one base class (app/domain/errors.py).

Every transport uses it, each in one place: the app factory's exception handlers for HTTP
(app/web/errors.py), `/v1`'s router-level handler for OpenAI's error shape
(app/domain/openai/errors.py), and the WebSocket's `rejected` frame (app/domain/chat/websocket/routes.py).
No handler catches a domain error to translate it. The routes' `raises=` lists, for the OpenAPI
document, come from the same classes (`documented`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from litestar.exceptions import (
    ClientException,
    HTTPException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    ServiceUnavailableException,
    TooManyRequestsException,
)
from litestar.status_codes import HTTP_409_CONFLICT

from app.db.session import BUSY, DatabaseBusyError, PoolTimeoutError
from app.db.storage import StorageRefusedError
from app.domain.errors import DomainError

DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    DomainError,
    DatabaseBusyError,
    PoolTimeoutError,
    StorageRefusedError,
)
"""The classes the transports install their handlers for: Litestar finds a handler by walking the
error's MRO (`get_exception_handler`, litestar/middleware/_internal/exceptions/middleware.py).
`DatabaseBusyError` is the database layer's (which knows nothing of clients): a database that
stayed locked is the server's state, not a bug, so a 503 that says when to try again; so is
SQLAlchemy's pool timeout (every pooled connection stayed taken, where no `transaction` turned
it into DatabaseBusyError: a send's own session), and `StorageRefusedError`, a database out of
space or read-only (app/db/storage.py)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def refusal_for(exc: BaseException) -> Refusal | None:
    """What a domain error means for the client; None for anything else (a bug: a 500)."""
    if isinstance(exc, DomainError):
        return Refusal(exc.status, exc.public_message, exc.headers)
    if isinstance(exc, DatabaseBusyError):
        return Refusal(503, str(exc), {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, PoolTimeoutError):
        return Refusal(503, BUSY, {"Retry-After": str(DatabaseBusyError.retry_after_s)})
    if isinstance(exc, StorageRefusedError):
        return Refusal(503, str(exc), {"Retry-After": str(exc.retry_after_s)})
    return None


class ConflictError(ClientException):
    """409, for the OpenAPI document (Litestar has no named exception for it)."""

    status_code = HTTP_409_CONFLICT


# Litestar documents a `raises=` entry by its HTTPException class (its name becomes the response's
# description: `create_error_responses`, litestar/_openapi/responses.py), one class per status.
_DOCUMENTED_AS: dict[int, type[HTTPException]] = {
    cls.status_code: cls
    for cls in (
        ClientException,
        NotAuthorizedException,
        PermissionDeniedException,
        NotFoundException,
        ConflictError,
        TooManyRequestsException,
        ServiceUnavailableException,
    )
}


def documented(*errors: type[DomainError]) -> list[type[HTTPException]]:
    """A route's `raises=` entries for the domain errors it may answer with: one per status."""
    return list(dict.fromkeys(_DOCUMENTED_AS[error.status] for error in errors))
