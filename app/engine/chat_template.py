"""Chat messages to prompt text, with the Jinja template the model was trained with.

GGUF files carry the Hugging Face chat template under `tokenizer.chat_template`. We render it the
way `transformers.apply_chat_template` does (trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text) so the prompt matches
what the model saw in training. The template comes from a model file, i.e. from outside, so it
runs in Jinja's immutable sandbox: it can format strings, but not reach Python internals or mutate
the messages. A model without a template gets ChatML, which SmolLM2 and many small models use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.engine.base import EngineError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The fallback when a model carries no template of its own."""


class ChatTemplateError(EngineError):
    """The messages cannot be rendered: the template rejected them, or it is broken."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        extensions=["jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to.

    Compile once per model; `render` is then cheap enough to call on the event loop per request.
    """

    __slots__ = ("_template", "bos_token", "eos_token", "is_fallback", "source")

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.is_fallback = not source
        self.source = source or CHATML_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(self.source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for `messages`, ending with the assistant's turn opener by default."""
        plain = [dict(m) for m in messages]
        try:
            return self._template.render(
                messages=plain,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"cannot render the conversation: {exc}") from exc
        except (TypeError, KeyError, ValueError) as exc:
            raise ChatTemplateError(f"malformed messages for the chat template: {exc!r}") from exc
