"""FAKE tensorrt_llm.llmapi: `TorchLlmArgs`, reduced to the names of its fields.

The names are 1.0's (tensorrt_llm/llmapi/llm_args.py at v1.0: `enable_trtllm_sampler` and
`enable_mixed_sampler` exist, `sampler_type` does not yet). A test may swap the set to model
another version (`sampler_type` from 1.1; neither in the newest, where TorchSampler is the only
sampler).
"""

from __future__ import annotations

from typing import Any, ClassVar

V1_0_FIELDS = frozenset(
    {
        "tokenizer",
        "backend",
        "max_seq_len",
        "max_batch_size",
        "max_num_tokens",
        "kv_cache_config",
        "tensor_parallel_size",
        "trust_remote_code",
        "enable_iter_perf_stats",
        "enable_chunked_prefill",
        "enable_trtllm_sampler",
        "enable_mixed_sampler",
        "disable_overlap_scheduler",
        "stream_interval",
    }
)


class TorchLlmArgs:
    model_fields: ClassVar[dict[str, Any]] = dict.fromkeys(V1_0_FIELDS)
