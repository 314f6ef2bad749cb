"""What TensorRT-LLM says about a request, in the engine contract's terms.

- refusals: the worker wraps what it refuses in `RequestError`, a RuntimeError (executor/utils.py,
  executor/base_worker.py `_enqueue_request`); they become `EngineError` / `PromptTooLongError`
  (a 400). Only a shut-down LLM ("LLM is shutting down", llmapi/llm.py; or a background error,
  which executor/executor.py `_handle_background_error` raises once and then shuts the LLM down)
  is `EngineUnavailableError`;
- endings: `CompletionOutput.finish_reason` becomes a `FinishReason`, and anything else (a
  `timeout`, a reason this adapter does not know) an error.

Paths are relative to `tensorrt_llm/` in NVIDIA/TensorRT-LLM's sources (1.0 and newer).
"""

from __future__ import annotations

import contextlib
import importlib
import re
from typing import Any

from app.engine.base import EngineError, EngineUnavailableError, FinishReason, PromptTooLongError

# TensorRT-LLM's CompletionOutput.finish_reason values, and what they mean here.
_FINISH_REASONS = {
    "stop": FinishReason.STOP,  # end-of-sequence token (or a stop word, which we never pass)
    "length": FinishReason.LENGTH,
    "cancelled": FinishReason.CANCELLED,
}
# What base_worker._deduce_max_tokens says when the prompt leaves no room for a reply.
_NO_ROOM = re.compile(r"max_seq_len|default_max_tokens|prompt length", re.IGNORECASE)


class NeverRaised(Exception):
    """Stands in for `RequestError` where a version does not define it."""


def request_error_type() -> type[BaseException]:
    """TensorRT-LLM's per-request failure (executor/utils.py `RequestError(RuntimeError)`)."""
    for module in ("tensorrt_llm.executor.utils", "tensorrt_llm.executor"):
        with contextlib.suppress(ImportError):
            error = getattr(importlib.import_module(module), "RequestError", None)
            if isinstance(error, type) and issubclass(error, BaseException):
                return error
    return NeverRaised


def is_shut_down(llm: Any, exc: Exception) -> bool:
    """Whether `generate_async` failed because the LLM has shut down (it takes no more requests)."""
    executor = getattr(llm, "_executor", None)
    shut_down = getattr(executor, "is_shutdown", None)
    return (callable(shut_down) and shut_down()) or "shutting down" in str(exc)


def refusal(
    exc: Exception,
    llm: Any,
    request_error: type[BaseException],
    prompt_tokens: int,
    context_size: int,
) -> EngineError:
    """What `generate_async` raised, as our error: a shut-down LLM is unavailable; anything
    else is about this request (a 400)."""
    if is_shut_down(llm, exc):
        return EngineUnavailableError(f"TensorRT-LLM cannot take requests: {exc}")
    if isinstance(exc, (ValueError, TypeError, request_error)) and _NO_ROOM.search(str(exc)):
        return PromptTooLongError(prompt_tokens, context_size)
    return EngineError(f"TensorRT-LLM refused the request: {exc}")


def backend_ending(trt_reason: str | None) -> tuple[FinishReason, str | None]:
    """How a request TensorRT-LLM says is over ends here: (reason, error text for an error)."""
    reason = _FINISH_REASONS.get(trt_reason or "")
    if reason is not None:
        return reason, None
    error = "TensorRT-LLM timed out the request" if trt_reason == "timeout" else None
    return FinishReason.ERROR, (
        error or f"TensorRT-LLM ended the request with finish_reason={trt_reason!r}"
    )
