"""The app's exception map: each domain error (app/domain/refusals.py) becomes its HTTP answer.

Litestar picks a handler by the exception's class (`get_exception_handler` walks the class's MRO:
litestar/middleware/_internal/exceptions/middleware.py), so one handler, keyed by the domain's
errors' base class, answers them all. The answer is the one Litestar gives an HTTPException (`create_exception_response`):
`{"status_code", "detail"}`. Log-in and sign-up limits keep their own body, `{"detail"}`, and
their Retry-After header.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.exceptions.responses import create_exception_response

from app.domain.accounts.ratelimit import TooManyAttemptsError
from app.domain.refusals import DOMAIN_ERRORS, refusal_for


def domain_error_response(request: Request, exc: Exception) -> Response[Any]:
    refusal = refusal_for(exc)
    if refusal is None:  # not reached: registered for the domain's error classes only
        return create_exception_response(request, exc)
    if isinstance(exc, TooManyAttemptsError):
        return Response(
            {"detail": refusal.message}, status_code=refusal.status, headers=refusal.headers
        )
    http = HTTPException(
        detail=refusal.message, status_code=refusal.status, headers=refusal.headers or None
    )
    return create_exception_response(request, http)


def all_subclasses(classes: tuple[type[Exception], ...]) -> set[type[Exception]]:
    """The classes and their subclasses: Litestar's `disable_stack_trace` matches exact classes."""
    found: set[type[Exception]] = set()
    pending = list(classes)
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.add(cls)
            pending.extend(cls.__subclasses__())
    return found


EXCEPTION_HANDLERS = {cls: domain_error_response for cls in DOMAIN_ERRORS}
