"""FAKE tensorrt_llm.llmapi: `TorchLlmArgs` (reduced to the names of its fields) and `KvCacheConfig`.

The field names follow the release in `FAKE_TRTLLM_VERSION` (tensorrt_llm/llmapi/llm_args.py):
1.0 has `enable_trtllm_sampler` and `enable_mixed_sampler`; from 1.1 both are gone and
`sampler_type` picks the sampler ("TorchSampler", "TRTLLMSampler" or "auto"); 1.4 still accepts the
field but rejects "TRTLLMSampler" (docs features/sampling.md at 1.4.0rc4: TorchSampler is the only
sampler). `release_fields` gives the set for a version; a test sets `TorchLlmArgs.model_fields`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

_COMMON = frozenset(
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
        "disable_overlap_scheduler",
        "stream_interval",
    }
)
V1_0_FIELDS = _COMMON | {"enable_trtllm_sampler", "enable_mixed_sampler"}
V1_1_FIELDS = _COMMON | {"sampler_type"}  # 1.1 to 1.4


def version_tuple(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def release_fields(version: str) -> frozenset[str]:
    return V1_0_FIELDS if version_tuple(version) < (1, 1) else V1_1_FIELDS


@dataclass
class KvCacheConfig:
    """llmapi/llm_args.py KvCacheConfig: block reuse (the prefix cache) is on by default."""

    enable_block_reuse: bool = True
    free_gpu_memory_fraction: float | None = None


class TorchLlmArgs:
    model_fields: ClassVar[dict[str, Any]] = dict.fromkeys(
        release_fields(os.environ.get("FAKE_TRTLLM_VERSION", "1.0.0"))
    )
