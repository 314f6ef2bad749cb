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

# The settings a reply gets when neither its request nor its conversation gives them, chosen for
# the bundled SmolLM2-135M-Instruct. Its GGUF carries no sampling metadata (no `general.sampling.*`
# keys); its model card generates with temperature 0.2 and top-p 0.9. Those alone make a 135M
# model loop more, not less (it settles into its likeliest sentence and repeats it): what ends
# replies is a mild repeat penalty (1.1; llama.cpp's own default is 1.0, off); min-p 0.05
# (llama.cpp's default, common/common.h) trims the long tail a small model puts weight on. bench/reply_endings.py,
# 20 everyday prompts x 2 seeds, 512 tokens, share of replies cut by the limit: old defaults
# (temperature 0.7, top-p 1) 5% (30% in a 1-seed run), the card's 32%, card + min-p 25%,
# card + repeat penalty 2.5%, these 2.5% (0% with min-p first, as the engine now applies it;
# 0% in the 1-seed run). Figures in bench/README.md.
MODEL_DEFAULTS = ReplyOptions(
    temperature=0.2,
    top_p=0.9,
    top_k=0,
    min_p=0.05,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    repeat_penalty=1.1,
)


def overlay(top: ReplyOptions, under: ReplyOptions) -> ReplyOptions:
    """`top`'s sampling settings, with `under`'s wherever `top` leaves one out."""
    given = {
        name: value if (value := getattr(top, name)) is not None else getattr(under, name)
        for name in ReplyOptions.__struct_fields__
    }
    return ReplyOptions(**given)


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

    def sampling(
        self, options: ReplyOptions, context_size: int, *, defaults: ReplyOptions = MODEL_DEFAULTS
    ) -> SamplingParams:
        """The request's sampling parameters, range-checked; `defaults` fill what it leaves out."""
        o = overlay(options, overlay(defaults, MODEL_DEFAULTS))  # every setting but three given
        max_tokens = self.default_max_tokens if o.max_tokens is None else o.max_tokens
        if not 1 <= max_tokens <= context_size:
            raise InvalidInputError(
                f"max_tokens must be between 1 and {context_size}", field="max_tokens"
            )
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=o.temperature,
                top_p=o.top_p,
                top_k=o.top_k,
                seed=o.seed,
                stop=tuple(o.stop or ()),
                min_p=o.min_p,
                frequency_penalty=o.frequency_penalty,
                presence_penalty=o.presence_penalty,
                repeat_penalty=o.repeat_penalty,
            )  # type: ignore[arg-type]  # MODEL_DEFAULTS fills all but max_tokens, seed, stop
        except ValueError as exc:  # SamplingParams checks its own ranges (app/engine/base.py)
            raise InvalidInputError(str(exc)) from exc
