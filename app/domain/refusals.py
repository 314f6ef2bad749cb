"""What the domain's errors mean for a client, read off their one base class (app/domain/errors.py).

Every transport uses it, each in one place: the app factory's exception handlers for HTTP
(app/web/errors.py), `/v1`'s router-level handler for OpenAI's error shape
(app/domain/openai/errors.py), and the WebSocket's `rejected` frame (app/domain/chat/websocket/routes.py).
No handler catches a domain error to translate it. The routes' `raises=` lists, for the OpenAPI
document, come from the same classes (`documented`), with Litestar's own refusals a route may
answer with: a guard's 401 or 403, the CSRF check's 403 on writes outside `/v1`, the 413 of a
body over its size; and, on every route, the database's 503 (`DOMAIN_ERRORS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from litestar.exceptions import (
    ClientException,
    HTTPException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    ServiceUnavailableException,
    TooManyRequestsException,
    ValidationException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi.datastructures import ResponseSpec
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
# description: `create_error_responses`, litestar/_openapi/responses.py), one class per status: two
# classes of one status make the status's schema a `oneOf` of two identical shapes. 400 is
# ValidationException, the one Litestar adds itself for a route with parameters or a body.
_DOCUMENTED_AS: dict[int, type[HTTPException]] = {
    cls.status_code: cls
    for cls in (
        ValidationException,
        NotAuthorizedException,
        PermissionDeniedException,
        NotFoundException,
        ConflictError,
        RequestEntityTooLarge,
        TooManyRequestsException,
        ServiceUnavailableException,
    )
}


def documented(*errors: type[DomainError] | type[HTTPException]) -> list[type[HTTPException]]:
    """A route's `raises=`: one entry per status of the errors it may answer with, the domain's
    and Litestar's own (NotAuthorizedException, PermissionDeniedException...), lowest first.

    Always with the 503 of `DOMAIN_ERRORS`' database errors (locked, out of connections, lost,
    full or read-only): every route documented here reads the database, if only for the session's
    user (`SessionAuthenticationMiddleware`'s access cache). The session store's 503, when Redis is
    away, is the same answer (app/web/session_store.py). A route that reads a body lists
    `RequestEntityTooLarge`: Litestar's 413 for one over `request_max_body_size`
    (litestar/connection/request.py). Not listed: the 413 of a form body sent where none is read
    (the CSRF check reads it for a token: litestar/middleware/csrf.py)."""
    statuses = {
        error.status if issubclass(error, DomainError) else error.status_code for error in errors
    }
    statuses.add(ServiceUnavailableException.status_code)
    return [_DOCUMENTED_AS[status] for status in sorted(statuses)]


class AttemptsLimited(msgspec.Struct):
    """The body of a log-in or sign-up limit's 429 (`TooManyAttemptsError`): its own, with no
    `status_code` (app/web/errors.py), and a Retry-After header."""

    detail: str


TOO_MANY_ATTEMPTS_RESPONSE = {
    429: ResponseSpec(
        AttemptsLimited,
        description="too many attempts (log-in or sign-up limits): Retry-After says when to try again",
        generate_examples=False,  # nor shift the examples generated for the document's others
    )
}
"""For the routes that raise `TooManyAttemptsError`, next to their `raises=`: its 429 is described
by this instead (a route's `responses=` replaces the entry `raises=` makes for the same status)."""
