"""How many tokens one chat message takes in a prompt, for engines with a tokenizer and a template.

A message's count is its share of a rendered prompt: the prompt with it minus the prompt without
it, both after one fixed anchor message, so the template's framing of one message (ChatML's
`<|im_start|>role\n ... <|im_end|>\n`) is included and a default system prompt the template adds
to conversations without one (SmolLM2's does) is not. `overhead` bounds what a whole prompt holds
beyond its messages' counts: a BOS, that default system prompt, the reply's opener.

The layers above fit a history with these counts; `generate` still checks the real prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

Render = Callable[[Sequence[Mapping[str, str]], bool], str]  # (messages, add_generation_prompt)
Tokenize = Callable[[str], list[int]]

_ANCHOR = {"role": "system", "content": "."}
FRAMING_GUESS = 8
"""Tokens a template's framing of one message takes, for a message the template will not render
alone (a template that insists on alternating roles)."""


class MessageCounter:
    """Counts with one model's template and tokenizer."""

    def __init__(self, render: Render, tokenize: Tokenize) -> None:
        self._render = render
        self._tokenize = tokenize
        self._anchor = len(tokenize(render([_ANCHOR], False)))
        one = {"role": "user", "content": "A"}
        whole = len(tokenize(render([one], True)))
        self.overhead = max(0, whole - self.count(one))

    def count(self, message: Mapping[str, str]) -> int:
        try:
            framed = self._tokenize(self._render([_ANCHOR, message], False))
        except Exception:  # a template's own refusal (jinja2, ValueError, EngineError...)
            return len(self._tokenize(str(message.get("content", "")))) + FRAMING_GUESS
        return max(1, len(framed) - self._anchor)
