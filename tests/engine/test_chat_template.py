"""Chat template rendering: HF-compatible Jinja, sandboxed, with a ChatML fallback."""

from __future__ import annotations

import pytest

from app.engine.base import EngineError
from app.engine.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError

# SmolLM2-135M-Instruct's template, as stored in its GGUF (tokenizer.chat_template).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

USER_ONLY = [{"role": "user", "content": "Hi there"}]


def test_fallback_is_chatml() -> None:
    template = ChatTemplate(None)
    assert template.is_fallback
    assert template.source == CHATML_TEMPLATE
    assert template.render(USER_ONLY) == (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_empty_template_falls_back_too() -> None:
    assert ChatTemplate("").is_fallback


def test_generation_prompt_can_be_left_out() -> None:
    text = ChatTemplate(None).render(USER_ONLY, add_generation_prompt=False)
    assert not text.endswith("<|im_start|>assistant\n")


def test_smollm2_template_adds_its_default_system_prompt() -> None:
    text = ChatTemplate(SMOLLM2_TEMPLATE).render(USER_ONLY)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_template_keeps_a_given_system_prompt() -> None:
    messages = [{"role": "system", "content": "Be terse."}, *USER_ONLY]
    text = ChatTemplate(SMOLLM2_TEMPLATE).render(messages)
    assert text.startswith("<|im_start|>system\nBe terse.<|im_end|>\n")
    assert "SmolLM" not in text


def test_special_tokens_are_available() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert template.render(USER_ONLY) == "<s>Hi there</s>"


def test_hf_style_whitespace_control() -> None:
    # trim_blocks + lstrip_blocks, as transformers renders templates
    template = ChatTemplate("{% for m in messages %}\n  {{ m['content'] }}\n{% endfor %}")
    assert template.render(USER_ONLY) == "  Hi there\n"


def test_tojson_keeps_unicode() -> None:
    template = ChatTemplate("{{ messages[0]['content'] | tojson }}")
    assert template.render([{"role": "user", "content": "日本 🎉"}]) == '"日本 🎉"'


def test_raise_exception_becomes_an_engine_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="user first") as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert isinstance(info.value, EngineError)


def test_missing_content_is_an_engine_error() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(None).render([{"role": "user"}])


def test_broken_template_is_reported_at_load() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",  # reach Python internals
        "{{ messages.append({'role': 'x'}) }}",  # mutate the caller's data
        "{{ ''.__class__.__subclasses__() }}",
    ],
)
def test_template_runs_sandboxed(source: str) -> None:
    messages = [*USER_ONLY]
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(messages)
    assert messages == USER_ONLY


def test_caller_messages_are_not_touched() -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].update({'content': 'y'}) }}").render(messages)
    assert messages[0]["content"] == "x"
