"""Every error under `/v1` in OpenAI's shape, so that OpenAI's clients raise their usual exceptions.

The router installs `openai_error_response` for every exception; a domain error gets its status
and message from the app's one map (app/domain/refusals.py), as over the page API.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from app.domain.chat.replies.service import TooManyRepliesError
from app.domain.errors import ContextLengthExceededError
from app.domain.openai.schemas import openai_error
from app.domain.quotas.service import QuotaExceededError
from app.domain.refusals import refusal_for

ERRORS = {
    400: (
        "an invalid request (the message says what is wrong; `param` names the field at fault). "
        'Messages too long for the model\'s context are `code: "context_length_exceeded"`, '
        '`param: "messages"`, as OpenAI answers them: nothing is ever cut to make them fit'
    ),
    401: "no API key, or one that is not valid",
    404: "no such model",
    413: "a request body over 10 MB (Litestar's `request_max_body_size`)",
    429: "too many replies in progress (code `rate_limit_exceeded`), or the key's owner has used "
    "up their token quota for the day or month (type and code `insufficient_quota`; Retry-After "
    "says when it resets)",
    503: "the server is not taking requests (shutting down), or the database is busy or refusing "
    "writes (with a Retry-After): try again in a moment",
}
"""The statuses `/v1` documents, for the OpenAPI document: `/v1/models`, which reads no body,
documents 401 and 503 (every request's API key is looked up in the database)."""


class OpenAIError(HTTPException):
    """A request `/v1` refuses in OpenAI's terms (`param`, `code` name what was wrong)."""

    # A client error unless told otherwise. Litestar decides whether to log a traceback from the
    # exception's class attribute (litestar/middleware/_internal/exceptions/middleware.py,
    # handle_exception_logging), so the default must not be HTTPException's 500.
    status_code = 400

    def __init__(self, message: str, status_code: int = 400, **fields: Any) -> None:
        super().__init__(detail=message, status_code=status_code)
        self.fields = fields


def openai_error_response(request: Request, exc: Exception) -> Response[Any]:
    status = getattr(exc, "status_code", 500)
    fields = getattr(exc, "fields", {})
    headers: dict[str, str] = {}
    if isinstance(exc, ValidationException):
        message = f"invalid request: {exc.extra or exc.detail}"
    elif isinstance(exc, HTTPException):
        message = exc.detail
    elif isinstance(exc, ContextLengthExceededError):  # OpenAI's words, so clients recognise it
        status, message = 400, context_length_message(exc)
        fields = {"param": "messages", "code": "context_length_exceeded"}
    elif (refusal := refusal_for(exc)) is not None:  # a domain error: the app's one map
        status, message, headers = refusal.status, refusal.message, refusal.headers
        fields = {
            "param": getattr(exc, "field", None),  # an InvalidInputError's
            # As OpenAI's own 429s; its other errors carry no code.
            "code": "rate_limit_exceeded" if isinstance(exc, TooManyRepliesError) else None,
        }
    else:
        message = "internal server error"
    kind = {401: "authentication_error", 404: "invalid_request_error", 429: "requests"}.get(
        status, "invalid_request_error"
    )
    if isinstance(exc, QuotaExceededError):  # OpenAI's own shape for a quota used up
        kind = fields["code"] = "insufficient_quota"
    if status >= 500:
        kind = "server_error"
    return Response(openai_error(message, kind=kind, **fields), status_code=status, headers=headers)


def context_length_message(exc: ContextLengthExceededError) -> str:
    """OpenAI's message for it ("This model's maximum context length is 8192 tokens. However,
    your messages resulted in 8227 tokens. Please reduce the length of the messages."), saying
    which limit it is: the context holds the reply too."""
    if exc.reply_room:
        limit = (
            f"This model's maximum context length is {exc.limit} tokens, "
            f"the messages and at least one token of the reply together."
        )
    else:
        limit = f"This model takes at most {exc.limit} tokens of messages in one request."
    return (
        f"{limit} However, your messages resulted in {exc.prompt_tokens} tokens. "
        f"Please reduce the length of the messages."
    )
