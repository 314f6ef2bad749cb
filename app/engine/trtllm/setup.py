"""Finding, importing and configuring TensorRT-LLM (>= 1.0, PyTorch backend) for `TrtLlmEngine`.

What it relies on was read in NVIDIA/TensorRT-LLM's sources (1.0 and the newer releases; paths
relative to `tensorrt_llm/`), cited where it is used.

Sampling: 1.0's TorchSampler takes a batch-wide greedy fast path unless the LLM is built with
`enable_trtllm_sampler` or `enable_mixed_sampler` (_torch/pyexecutor/sampler.py: `fast_path = not
self.enable_mixed_sampler and ...` -> argmax), silently ignoring temperature, top-p and top-k.
`sampler_options` picks, from the fields the installed version's `TorchLlmArgs` has, the option
that applies each request's sampling: where the fast path exists (the `enable_mixed_sampler` field
does), the TRTLLM sampler (it also honours the per-request seed); in later versions (1.1's
`sampler_type`, or no field at all) TorchSampler, which samples each request its own way there.
The choice is logged at start-up with the version and backend.

Worker process or not (`EngineSettings.trtllm_in_process`, env TRTLLM_IN_PROCESS, default off):
with one GPU the LLM API runs the executor in a spawned worker process and ships responses over
IPC; with TLLM_WORKER_USE_SINGLE_PROCESS=1 it runs in this process, and TensorRT-LLM itself warns
that this "may hurt streaming generation performance" (executor/executor.py `create`): the
executor's threads then share this interpreter's GIL with the web server, and a CUDA fault takes
the server down. The worker process is the default until bench/gpu_smoke.py measures otherwise
(it prints both). TensorRT-LLM reads the variable once per process (llmapi/utils.py:
`enable_worker_single_process_for_tp1` is `@cache`d): the adapter sets it only while it has not
been read, and reports the mode actually in effect (`stats().extra["trt_in_process"]`), warning
when that is not the one asked for.

`tensorrt_llm` is imported only when the engine starts (it pulls in torch and CUDA); where it is not
installed, selecting this engine fails at once with `TrtLlmUnavailableError`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import re
import sys
from types import ModuleType
from typing import Any

from app.engine.base import EngineUnavailableError, SamplingParams

log = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a Hugging Face name or a local directory
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"
MIN_VERSION = (1, 0)  # before 1.0, tensorrt_llm.LLM is the TensorRT-engine backend
INSTALL_HINT = (
    "TensorRT-LLM is not installed. It needs an NVIDIA GPU with CUDA and comes from NVIDIA's "
    "package index, not PyPI: pip install -e '.[gpu]' --extra-index-url https://pypi.nvidia.com "
    "(see NVIDIA's TensorRT-LLM installation guide), or choose ENGINE=llamacpp or "
    "ENGINE=synthetic."
)


class TrtLlmUnavailableError(EngineUnavailableError):
    """`tensorrt_llm` cannot be imported on this machine, or is older than 1.0."""


def tensorrt_llm_installed() -> bool:
    """Whether `tensorrt_llm` could be imported, without importing it (that costs seconds)."""
    if "tensorrt_llm" in sys.modules:
        return sys.modules["tensorrt_llm"] is not None
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


def import_tensorrt_llm() -> ModuleType:
    """Import `tensorrt_llm` (>= 1.0), turning every way that fails into one clear error."""
    try:
        trt = importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtLlmUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    except (OSError, RuntimeError) as exc:  # installed, but CUDA or a shared library is missing
        raise TrtLlmUnavailableError(
            f"tensorrt_llm is installed but failed to import: {exc}. It needs an NVIDIA GPU, "
            f"its CUDA runtime and a matching torch; see NVIDIA's TensorRT-LLM installation guide."
        ) from exc
    version = str(getattr(trt, "__version__", "0"))
    if version_tuple(version) < MIN_VERSION:
        raise TrtLlmUnavailableError(
            f"tensorrt_llm {version} is too old: this engine needs 1.0 or newer, where "
            f"tensorrt_llm.LLM is the PyTorch backend (before 1.0 it builds TensorRT engines). "
            f"pip install -e '.[gpu]' --extra-index-url https://pypi.nvidia.com"
        )
    return trt


def version_tuple(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def llm_arg_fields(trt: ModuleType) -> frozenset[str]:
    """The names `tensorrt_llm.LLM(...)` accepts: the fields of the PyTorch backend's arguments
    (llmapi/llm_args.py `TorchLlmArgs`, a pydantic model, also exported by `tensorrt_llm.llmapi`)."""
    for module in ("tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args"):
        with contextlib.suppress(ImportError):
            args = getattr(importlib.import_module(module), "TorchLlmArgs", None)
            fields = getattr(args, "model_fields", None)
            if isinstance(fields, dict) and fields:
                return frozenset(fields)
    log.warning("cannot read TensorRT-LLM's TorchLlmArgs: the sampler is left at its default")
    return frozenset()


def sampler_options(fields: frozenset[str]) -> tuple[dict[str, Any], str]:
    """The `LLM(...)` arguments under which each request's own sampling is applied, and the name
    of the sampler they select (see the module docstring).

    `enable_mixed_sampler` exists exactly where TorchSampler still has its batch-wide greedy fast
    path (1.0); there the TRTLLM sampler is chosen, through whichever field this version has for
    it, since it applies temperature, top-p, top-k and the seed per request. Elsewhere TorchSampler
    samples each request its own way."""
    if "enable_trtllm_sampler" in fields:  # 1.0
        return {"enable_trtllm_sampler": True}, "TRTLLMSampler (enable_trtllm_sampler=True)"
    if "enable_mixed_sampler" in fields:
        if "sampler_type" in fields:
            return {"sampler_type": "TRTLLMSampler"}, "TRTLLMSampler (sampler_type)"
        return {"enable_mixed_sampler": True}, "TorchSampler (enable_mixed_sampler=True)"
    if "sampler_type" in fields:  # 1.1+: TorchSampler applies each request's strategy
        return {"sampler_type": "TorchSampler"}, "TorchSampler (sampler_type='TorchSampler')"
    return {}, "TorchSampler (the only sampler in this version)"


def apply_worker_mode(in_process: bool) -> bool:
    """Set TLLM_WORKER_USE_SINGLE_PROCESS for the LLM about to be built, unless this process has
    read it already (llmapi/utils.py caches the answer); return the mode in effect."""
    probe = None
    with contextlib.suppress(ImportError):
        utils = importlib.import_module("tensorrt_llm.llmapi.utils")
        probe = getattr(utils, "enable_worker_single_process_for_tp1", None)
    cache_info = getattr(probe, "cache_info", None)
    already_read = cache_info is not None and cache_info().currsize > 0
    if not already_read:
        os.environ[SINGLE_PROCESS_ENV] = "1" if in_process else "0"
    effective = bool(probe()) if callable(probe) else in_process
    if effective != in_process:
        log.warning(
            "TRTLLM_IN_PROCESS=%d has no effect: TensorRT-LLM already read %s in this process and "
            "keeps the executor %s",
            in_process,
            SINGLE_PROCESS_ENV,
            "in this process" if effective else "in its worker process",
        )
    return effective


def sampling_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """Our sampling parameters as TensorRT-LLM `SamplingParams` keyword arguments.

    Greedy is `top_k=1` (TensorRT-LLM's own notion of greedy decoding) rather than temperature 0,
    which not every backend accepts. Stop strings are left out on purpose (see `app.engine.trtllm.engine`).
    """
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "detokenize": True}
    if params.greedy:
        kwargs["top_k"] = 1
    else:
        kwargs["temperature"] = params.temperature
        kwargs["top_p"] = params.top_p
        if params.top_k > 0:
            kwargs["top_k"] = params.top_k
    if params.seed is not None:
        kwargs["seed"] = params.seed
    # tensorrt_llm/sampling_params.py: `min_p`, `repetition_penalty`, `presence_penalty` and
    # `frequency_penalty` (None: the runtime's neutral default); set only when they do something.
    if params.min_p > 0.0 and not params.greedy:
        kwargs["min_p"] = params.min_p
    if params.repeat_penalty != 1.0:
        kwargs["repetition_penalty"] = params.repeat_penalty
    if params.presence_penalty != 0.0:
        kwargs["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty != 0.0:
        kwargs["frequency_penalty"] = params.frequency_penalty
    return kwargs


def executor_max_seq_len(llm: Any) -> int | None:
    """The limit the executor enforces: base_worker.py keeps the model engine's (possibly
    lower) `max_seq_len` on the in-process worker; otherwise the LLM's arguments."""
    for value in (
        getattr(getattr(llm, "_executor", None), "max_seq_len", None),
        getattr(getattr(llm, "args", None), "max_seq_len", None),
    ):
        if isinstance(value, int) and value > 0:
            return value
    return None
