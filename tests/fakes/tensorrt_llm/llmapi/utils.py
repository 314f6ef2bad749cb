"""FAKE tensorrt_llm.llmapi.utils: the worker-process switch, read once per process as the real
`enable_worker_single_process_for_tp1` is (`@cache`), so a later change of the variable is ignored."""

from __future__ import annotations

import os
from functools import cache


@cache
def enable_worker_single_process_for_tp1() -> bool:
    return os.environ.get("TLLM_WORKER_USE_SINGLE_PROCESS", "0") == "1"
