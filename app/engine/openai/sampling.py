"""The sampling fields of a chat request, as each kind of upstream names them.

OpenAI's own fields (temperature, top_p, frequency_penalty, presence_penalty, seed) go to every
upstream, always with the request's value, so that no server's default stands in for the app's.
The rest are extensions, and the servers differ on their names, on what "off" is, and on whether
an unknown field is ignored or refused; `Upstream.server` (its `GET /models` `owned_by`) says
which one is there:

llama-server ("llamacpp": tools/server/server-schema.cpp, `make_llama_cmpl_schema`)
    `top_k` (0: off; its default is 40), `min_p` (its default is 0.05), `repeat_penalty` over
    the last `repeat_last_n` tokens (its default 64). Its window holds the prompt's tokens as well
    as the reply's (server-context.cpp feeds the prompt to the sampler, `common_sampler_accept`),
    and its frequency and presence penalties use the same window: the window is made as long as
    the reply may be, but the prompt's last tokens count where OpenAI's penalties would not.
    Unknown fields are ignored.
vLLM ("vllm": vllm/sampling_params.py)
    `top_k` (-1: off; recent releases read 0 so too), `min_p`, `repetition_penalty` (over the prompt and the
    reply). Unknown fields are ignored with a log line (entrypoints/openai/protocol.py,
    `OpenAIBaseModel.__log_extra_fields__`).
SGLang ("sglang": python/sglang/srt/sampling/sampling_params.py)
    `top_k` (-1: off; 0 is refused), `min_p`, `repetition_penalty` (prompt and reply).
trtllm-serve ("tensorrt_llm": tensorrt_llm/serve/openai_protocol.py, `ChatCompletionRequest`)
    `top_k` (0: off), `min_p`, `repetition_penalty`. Unknown fields are refused (400: its
    `OpenAIBaseModel` has `extra="forbid"`), so only its own names go there.
Any other server (Dynamo's frontend, a proxy)
    `top_k`, `min_p` and `repetition_penalty` (the name vLLM, SGLang, trtllm-serve and Dynamo
    share) only when they do something: a server that does not know them then refuses the
    request, or ignores them, but is never sent an "off" it might read otherwise.

Greedy (temperature 0) replies are the same everywhere; sampled ones are not: each server draws
with its own generator, so a seed reproduces a reply only on the same kind of server.
"""

from __future__ import annotations

from typing import Any

from app.engine.base import SamplingParams

# The value each server reads as "no top-k cut".
_TOP_K_OFF = {"llamacpp": 0, "vllm": -1, "sglang": -1, "tensorrt_llm": 0}


def sampling_fields(params: SamplingParams, server: str) -> dict[str, Any]:
    """The request's sampling fields, named and valued for `server` (see the module docstring)."""
    fields: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
    }
    if params.seed is not None:
        fields["seed"] = params.seed
    if server in _TOP_K_OFF:
        fields["top_k"] = params.top_k or _TOP_K_OFF[server]
        fields["min_p"] = params.min_p
        if server == "llamacpp":
            fields["repeat_penalty"] = params.repeat_penalty
            fields["repeat_last_n"] = params.max_tokens
        else:
            fields["repetition_penalty"] = params.repeat_penalty
        return fields
    if params.top_k:
        fields["top_k"] = params.top_k
    if params.min_p:
        fields["min_p"] = params.min_p
    if params.repeat_penalty != 1.0:
        fields["repetition_penalty"] = params.repeat_penalty
    return fields
