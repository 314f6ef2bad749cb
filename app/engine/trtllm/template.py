"""The model's chat template through TensorRT-LLM's tokenizer (a Hugging Face tokenizer): the
prompt as token ids, and what each message adds to it (for fitting a conversation)."""

from __future__ import annotations

from typing import Any

from app.engine.base import ChatMessages, EngineError
from app.engine.token_counting import MessageCounter


def prompt_ids(tokenizer: Any, messages: ChatMessages) -> list[int]:
    """The prompt TensorRT-LLM is handed: the template rendered, then encoded without special
    tokens (the template holds BOS already), so that `prompt_tokens` is what the model sees."""
    if not messages:
        raise EngineError("no messages to answer")
    conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        prompt = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    except Exception as exc:  # template errors come as jinja2 / ValueError / KeyError
        raise EngineError(f"cannot render the chat template: {exc}") from exc


def message_counter(tokenizer: Any) -> MessageCounter:
    """Counts of each message's tokens in the same template and encoding as `prompt_ids`."""
    return MessageCounter(
        lambda messages, opener: tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=opener
        ),
        lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
    )
