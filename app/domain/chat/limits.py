"""What the domain accepts from a request for a reply: the message, and its sampling settings.

The rules live here once; every transport's request goes through them (the page's via
ReplyService, `/v1`'s sampling settings too), and a refusal is an InvalidInputError, which each
transport answers its own way through the app's one map (a 400, a `rejected` frame with status
400, OpenAI's error shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.chat.schemas import ReplyOptions
from app.domain.errors import InvalidInputError
from app.engine.base import SamplingParams


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    default_max_tokens: int  # a reply's length when the request does not say
    max_message_chars: int  # the longest message accepted

    def content(self, text: str) -> str:
        """The message, if it is one the domain takes."""
        if not text.strip():
            raise InvalidInputError("the message is empty")
        if len(text) > self.max_message_chars:
            raise InvalidInputError(
                f"the message is {len(text)} characters; the limit is {self.max_message_chars}"
            )
        return text

    def sampling(self, options: ReplyOptions, context_size: int) -> SamplingParams:
        """The request's sampling parameters, range-checked."""
        max_tokens = self.default_max_tokens if options.max_tokens is None else options.max_tokens
        if not 1 <= max_tokens <= context_size:
            raise InvalidInputError(
                f"max_tokens must be between 1 and {context_size}", field="max_tokens"
            )
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=0.7 if options.temperature is None else options.temperature,
                top_p=1.0 if options.top_p is None else options.top_p,
                top_k=options.top_k or 0,
                seed=options.seed,
                stop=tuple(options.stop or ()),
            )
        except ValueError as exc:  # SamplingParams checks its own ranges (app/engine/base.py)
            raise InvalidInputError(str(exc)) from exc
