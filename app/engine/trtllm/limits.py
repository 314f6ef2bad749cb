"""The limits TensorRT-LLM really enforces on a request, read at start and learnt from refusals.

- `context`: prompt + reply. The LLM is asked for `max_seq_len` = ENGINE_CONTEXT, but the worker
  enforces what the model engine settles on, which may be lower: capped by the model config's
  positions (`max_position_embeddings`) and by what its KV cache can hold (executor/base_worker.py:
  "max_seq_len might be updated by model engine"). The in-process worker shows that value
  (`llm._executor.max_seq_len`); the proxy to a worker process does not, so the model config
  (`llm._hf_model_config`, llmapi/llm.py) is read too, and a refusal that quotes a lower
  `max_seq_len` (base_worker.py `_deduce_max_tokens`) lowers it for every later request;
- `prompt`: without chunked prefill the PyTorch backend prefills a prompt in one iteration of at
  most `max_num_tokens` tokens (default 8192) and refuses a longer one (llmapi/llm.py
  `_check_arguments`). The adapter asks for chunked prefill where the release has the field, and
  reads back what is in effect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.engine.base import EngineError, PromptTooLongError

_MAX_SEQ_LEN = re.compile(r"max_seq_len \((\d+)\)")
_MAX_NUM_TOKENS = re.compile(r"max_num_tokens \((\d+)\)")


class PromptOverBatchError(PromptTooLongError):
    """A prompt longer than one prefill iteration takes (`max_num_tokens`, chunked prefill off)."""

    def __init__(self, prompt_tokens: int, max_num_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_size = max_num_tokens
        EngineError.__init__(
            self,
            f"prompt is {prompt_tokens} tokens but TensorRT-LLM takes at most {max_num_tokens} "
            f"prompt tokens (max_num_tokens, chunked prefill off): shorten the conversation",
        )


@dataclass(slots=True)
class Limits:
    context: int  # prompt + reply
    prompt: int  # the longest prompt taken (== context with chunked prefill)

    def check_prompt(self, prompt_tokens: int) -> None:
        """Refuse, with the real limit, a prompt TensorRT-LLM would refuse (the reply's room is
        `requests.reply_room`'s against `context`)."""
        if prompt_tokens + 1 > self.context:
            raise PromptTooLongError(prompt_tokens, self.context)
        if prompt_tokens > self.prompt:
            raise PromptOverBatchError(prompt_tokens, self.prompt)

    def learn(self, message: str, prompt_tokens: int) -> PromptTooLongError | None:
        """A refusal that quotes a limit lower than ours: take it for later requests, and
        return the error to show for this one (None: it is not about a limit)."""
        if match := _MAX_SEQ_LEN.search(message):
            limit = int(match[1])
            self.context = min(self.context, limit)
            self.prompt = min(self.prompt, limit)
            return PromptTooLongError(prompt_tokens, limit)
        if match := _MAX_NUM_TOKENS.search(message):
            self.prompt = min(self.prompt, int(match[1]))
            return PromptOverBatchError(prompt_tokens, int(match[1]))
        return None


def read_limits(llm: Any, asked: int) -> Limits:
    """What `llm` enforces, as far as this process can see (see the module docstring)."""
    args = getattr(llm, "args", None)
    context = min(
        v
        for v in (
            asked,
            getattr(getattr(llm, "_executor", None), "max_seq_len", None),
            getattr(args, "max_seq_len", None),
            getattr(getattr(llm, "_hf_model_config", None), "max_position_embeddings", None),
        )
        if isinstance(v, int) and v > 0
        # `asked` 0 (ENGINE_CONTEXT's default): whatever the model and its KV cache allow
    )
    max_num_tokens = getattr(args, "max_num_tokens", None)
    chunked = bool(getattr(args, "enable_chunked_prefill", False))
    if chunked or not isinstance(max_num_tokens, int) or max_num_tokens <= 0:
        return Limits(context, context)
    return Limits(context, min(context, max_num_tokens))
