"""`/v1`: OpenAI's chat completions and model list, authenticated by bearer API keys.

A few lines per route: the serving class (app/domain/openai/serving.py) does the work, the
protocol's shapes are in app/domain/openai/schemas.py, the error shape in app/domain/openai/errors.py.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, Response, Router, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody
from litestar.response import Stream

from app.domain.accounts.authentication import ApiKeyAuthenticationMiddleware
from app.domain.chat.replies.service import ReplyService
from app.domain.openai.errors import ERRORS, openai_error_response
from app.domain.openai.schemas import ChatCompletionRequest, ModelCard, ModelList, OpenAIErrorBody
from app.domain.openai.serving import OpenAIServingChat
from app.domain.refusals import DOMAIN_ERRORS
from app.engine import Engine


@post(
    "/chat/completions",
    status_code=200,
    responses={
        status: ResponseSpec(OpenAIErrorBody, description=description)
        for status, description in ERRORS.items()
    },
)
async def chat_completions(
    request: Request[UUID, Any, Any],
    replies: NamedDependency[ReplyService],
    engine: NamedDependency[Engine],
    data: JSONBody[ChatCompletionRequest],
) -> Response[Any] | Stream:
    """A chat completion, as JSON or (`stream: true`) as server-sent events, like OpenAI's.

    The body is decoded by Litestar through the app's SafeRequest (app/web/client_input.py): bad
    JSON, JSON nested too deeply and text that cannot be stored are 400s in OpenAI's shape, and a
    client that leaves mid-body is a quiet 499.
    """
    return await OpenAIServingChat(replies, engine).create(request, request.user, data)


@get(
    "/models",
    responses={
        status: ResponseSpec(OpenAIErrorBody, description=ERRORS[status]) for status in (401, 503)
    },
)
async def list_models(engine: NamedDependency[Engine]) -> ModelList:
    return ModelList(data=[ModelCard(id=engine.model_name)])


openai_router = Router(
    path="/v1",
    route_handlers=[chat_completions, list_models],
    # Every route here is an API key's owner's (`request.user`, the owner's id).
    middleware=[ApiKeyAuthenticationMiddleware],
    # The domain's error classes too: Litestar picks the handler by the error's class first
    # (`get_exception_handler`, litestar/middleware/_internal/exceptions/middleware.py), so the
    # app's map would win for them.
    exception_handlers={
        Exception: openai_error_response,
        **dict.fromkeys(DOMAIN_ERRORS, openai_error_response),
    },
    tags=["openai"],
)
