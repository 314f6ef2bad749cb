"""One base class for the domain's errors: each answers with its status and message, over HTTP
(the app factory's handlers), under /v1 (OpenAI's error shape) and on the WebSocket (`rejected`),
and the routes' `raises=` document the same statuses."""

from __future__ import annotations

from datetime import UTC, datetime

from litestar import Litestar, Router, get
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    ServiceUnavailableException,
    ValidationException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.testing import TestClient

from app.db.session import BUSY, DatabaseDisconnectedError, PoolTimeoutError
from app.domain.accounts.ratelimit import TooManyAttemptsError
from app.domain.chat.conversations.store import ConversationNotFoundError
from app.domain.chat.replies.rows import NotRegenerableError
from app.domain.chat.replies.service import NotFoundError, TooManyRepliesError, context_refusal
from app.domain.chat.websocket.frames import BadFrameError
from app.domain.chat.websocket.routes import rejection
from app.domain.errors import (
    ContextLengthExceededError,
    DomainError,
    EngineRefusedError,
    InvalidInputError,
    UnavailableError,
)
from app.domain.json_input import BadJsonError
from app.domain.my_account.service import WrongPasswordError
from app.domain.openai.controllers import openai_router
from app.domain.openai.errors import context_length_message
from app.domain.quotas.service import QuotaExceededError
from app.domain.refusals import ConflictError, documented
from app.engine.base import PromptTooLongError
from app.engine.trtllm.limits import PromptOverBatchError
from app.web.errors import EXCEPTION_HANDLERS

CASES = {
    "not-found": (NotFoundError("x"), 404, "no such message"),
    "conversation": (ConversationNotFoundError("x"), 404, "no such conversation"),
    "regenerate": (NotRegenerableError("only the latest"), 409, "only the latest"),
    "busy": (TooManyRepliesError(8), 429, str(TooManyRepliesError(8))),
    "down": (UnavailableError("shutting down"), 503, "shutting down"),
    "pool": (PoolTimeoutError("QueuePool limit of size 10 overflow 10 reached"), 503, BUSY),
    "lost": (DatabaseDisconnectedError(), 503, str(DatabaseDisconnectedError())),
    "engine": (EngineRefusedError("prompt too long"), 400, "prompt too long"),
    "input": (InvalidInputError("bad value"), 400, "bad value"),
    "field": (
        InvalidInputError("max_tokens too big", field="max_tokens"),
        400,
        "max_tokens too big",
    ),
}


TOO_LONG = ContextLengthExceededError(
    "prompt is 2100 tokens but the model's context holds 2048", 2100, 2048, reply_room=True
)


def raising(name: str, exc: Exception):  # type: ignore[no-untyped-def]
    @get(f"/{name}", name=f"raise-{name}", sync_to_thread=False)
    def handler() -> None:
        raise exc

    return handler


def make_app() -> Litestar:
    handlers = [raising(name, exc) for name, (exc, _, _) in CASES.items()]
    v1 = Router(
        "/v1",
        route_handlers=[
            *(raising(name, exc) for name, (exc, _, _) in CASES.items()),
            raising("too-long", TOO_LONG),
        ],
        exception_handlers=openai_router.exception_handlers,
    )
    limited = raising("limited", TooManyAttemptsError(12.2))
    too_long = raising("too-long", TOO_LONG)
    quota = [raising("quota", USED_UP)]
    v1_quota = Router("/v1q", route_handlers=quota, exception_handlers=v1.exception_handlers)
    return Litestar(
        [*handlers, limited, too_long, v1, *quota, v1_quota], exception_handlers=EXCEPTION_HANDLERS
    )


USED_UP = QuotaExceededError(
    "day",
    10_000,
    datetime(2026, 12, 3, tzinfo=UTC),
    now=datetime(2026, 12, 2, 21, 30, tzinfo=UTC),
)


def test_every_domain_error_has_its_status_over_http_v1_and_the_websocket() -> None:
    with TestClient(make_app()) as client:
        for name, (exc, status, message) in CASES.items():
            page = client.get(f"/{name}")
            assert (page.status_code, page.json()) == (
                status,
                {"status_code": status, "detail": message},
            )
            api = client.get(f"/v1/{name}")
            assert api.status_code == status
            assert api.json()["error"]["message"] == message
            assert api.json()["error"]["code"] == ("rate_limit_exceeded" if status == 429 else None)
            assert api.json()["error"]["param"] == getattr(exc, "field", None)  # OpenAI's `param`
            assert rejection(exc, "send") == (message, status)


def test_a_prompt_over_the_context_is_openais_context_length_exceeded_under_v1() -> None:
    """Under /v1 in OpenAI's words and shape (clients match on the code); the page keeps the
    engine's message."""
    with TestClient(make_app()) as client:
        api = client.get("/v1/too-long")
        page = client.get("/too-long")
    assert api.status_code == 400
    error = api.json()["error"]
    assert error == {
        "message": "This model's maximum context length is 2048 tokens, the messages and at least"
        " one token of the reply together. However, your messages resulted in 2100 tokens."
        " Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    assert page.status_code == 400
    assert page.json()["detail"] == str(TOO_LONG)


def test_every_engines_prompt_limit_is_context_length_exceeded() -> None:
    """The engines' refusals (app/engine/base.py, TensorRT-LLM's prompt limit in
    app/engine/trtllm/limits.py) become the one domain error `/v1` answers as OpenAI does,
    each saying which limit it is."""
    over_context = context_refusal(PromptTooLongError(2048, 2048))
    assert (over_context.prompt_tokens, over_context.limit, over_context.reply_room) == (
        2048,
        2048,
        True,
    )
    assert str(over_context) == str(PromptTooLongError(2048, 2048))  # the page's words
    over_batch = context_refusal(PromptOverBatchError(9000, 8192))
    assert (over_batch.prompt_tokens, over_batch.limit, over_batch.reply_room) == (
        9000,
        8192,
        False,
    )
    assert context_length_message(over_batch) == (
        "This model takes at most 8192 tokens of messages in one request. However, your "
        "messages resulted in 9000 tokens. Please reduce the length of the messages."
    )


def test_a_used_up_quota_says_when_it_resets_and_v1_says_insufficient_quota() -> None:
    message = (
        "you have used your token quota for this day (10,000 tokens): it resets at "
        "2026-12-03 00:00 UTC (in 2 h 30 min)"
    )
    with TestClient(make_app()) as client:
        page = client.get("/quota")
        api = client.get("/v1q/quota")
    assert (page.status_code, page.json()["detail"]) == (429, message)
    assert page.headers["retry-after"] == "9001"
    assert api.status_code == 429 and api.headers["retry-after"] == "9001"
    assert api.json() == {
        "error": {
            "message": message,
            "type": "insufficient_quota",  # as OpenAI's own: its clients raise RateLimitError
            "param": None,
            "code": "insufficient_quota",
        }
    }
    assert rejection(USED_UP, "send") == (message, 429)


def test_login_limits_keep_their_body_and_retry_after() -> None:
    with TestClient(make_app()) as client:
        answer = client.get("/limited")
    assert answer.status_code == 429
    assert answer.json() == {"detail": "too many attempts: try again shortly"}
    assert answer.headers["retry-after"] == "13"


def test_anything_else_is_a_500_on_the_websocket() -> None:
    assert rejection(RuntimeError("a bug"), "send") == ("internal server error", 500)


def test_a_frame_the_websocket_cannot_read_keeps_its_own_answer() -> None:
    """Bad JSON is a 400 like any invalid input; an unknown type or fields that do not fit are
    answered without a status, as the socket always has."""
    assert rejection(BadJsonError("each frame must be a JSON object"), None) == (
        "each frame must be a JSON object",
        400,
    )
    assert rejection(BadFrameError("text must not contain NUL", "r"), None) == (
        "text must not contain NUL",
        400,
    )
    assert rejection(BadFrameError("unknown type 'x'", "r", status=None), None) == (
        "unknown type 'x'",
        None,
    )


def test_a_route_documents_the_statuses_of_the_domain_errors_it_raises() -> None:
    """With the database's 503 always (every documented route reads it), listed once."""
    assert documented(NotFoundError, ConversationNotFoundError) == [
        NotFoundException,
        ServiceUnavailableException,
    ]
    assert documented(UnavailableError, NotRegenerableError) == [
        ConflictError,
        ServiceUnavailableException,
    ]


def test_litestars_own_refusals_are_documented_by_the_same_helper_one_class_a_status() -> None:
    """A guard's 401 and 403 next to the domain's; a 400 is the ValidationException Litestar lists
    itself for a route with parameters (a second 400 class would make its schema a `oneOf`)."""
    assert documented(
        PermissionDeniedException, NotAuthorizedException, WrongPasswordError, InvalidInputError
    ) == [
        ValidationException,
        NotAuthorizedException,
        PermissionDeniedException,
        ServiceUnavailableException,
    ]
    assert documented(ClientException, BadJsonError, RequestEntityTooLarge) == [
        ValidationException,
        RequestEntityTooLarge,
        ServiceUnavailableException,
    ]


def test_every_domain_error_class_has_a_status_litestar_can_document() -> None:
    """`documented` maps every status a domain error has (a new one needs its Litestar class)."""
    pending, seen = [DomainError], []
    while pending:
        cls = pending.pop()
        seen.append(cls)
        pending.extend(cls.__subclasses__())
    assert TooManyAttemptsError in seen and BadFrameError in seen  # not vacuous
    for cls in seen:
        assert documented(cls)[0].status_code == cls.status
