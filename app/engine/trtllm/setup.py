"""Finding, importing and configuring TensorRT-LLM (>= 1.0, PyTorch backend) for `TrtLlmEngine`.

What it relies on was read in NVIDIA/TensorRT-LLM's sources (1.0 and the newer releases; paths
relative to `tensorrt_llm/`), cited where it is used.

Sampling (`sampler_options`), per release (_torch/pyexecutor/sampler.py; the versioned docs'
features/sampling.md): below 1.3 the TRTLLM sampler, the one that applies every field (1.0:
`enable_trtllm_sampler=True`, whose absence leaves 1.0's TorchSampler on a batch-wide greedy fast
path; 1.1 and 1.2: `sampler_type="TRTLLMSampler"`, since their TorchSampler has no penalties and
draws every request from one generator seeded 42, `self._global_seed = 42`). From 1.3 TorchSampler
(1.3 deprecates the TRTLLM sampler, 1.4 rejects it); it has the penalties from 1.3, but `seed`
still changes nothing there (one generator; per-request seeds are NVIDIA/TensorRT-LLM PR #17172,
merged after the 1.4 release candidates, the newest the stored sources cover). The sampler and
every field the release ignores are logged at start; where the LLM's arguments cannot be read the
engine refuses to start rather than decode greedily for everyone.

The TRTLLM sampler seeds a request without a seed with 0, every time ("it will initialize the random
table by random seed 0 every time, and generate same results", NVIDIA/TensorRT-LLM#1000): the
engine gives every sampled request without a seed a fresh random one (`sampling_kwargs`).

Cache isolation (`cache_options`): block reuse (the KV prefix cache) is on by default. Where
`generate_async` takes `cache_salt` (llmapi/llm.py, later 1.x: "limit the kv cache reuse to the
requests with the same string") each request is salted with its owner; where it does not, block
reuse is turned off (`KvCacheConfig(enable_block_reuse=False)`), so no owner's first token is
faster for what another asked. Chunked prefill is asked for where the release has the field
(see `limits`).

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
import inspect
import logging
import os
import random
import re
import sys
from dataclasses import dataclass
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
    (llmapi/llm_args.py `TorchLlmArgs`, a pydantic model, also exported by `tensorrt_llm.llmapi`).
    Refuses to start where they cannot be read: the sampler could not be chosen."""
    for module in ("tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args"):
        with contextlib.suppress(ImportError):
            args = getattr(importlib.import_module(module), "TorchLlmArgs", None)
            fields = getattr(args, "model_fields", None)
            if isinstance(fields, dict) and fields:
                return frozenset(fields)
    raise EngineUnavailableError(
        "cannot read TensorRT-LLM's TorchLlmArgs, so the sampler that applies each request's "
        "sampling cannot be chosen: refusing to start rather than answer everyone greedily"
    )


@dataclass(frozen=True, slots=True)
class SamplerChoice:
    kwargs: dict[str, Any]  # for LLM(...)
    name: str
    ignored: tuple[str, ...]  # our SamplingParams fields the sampler does not apply


def sampler_options(version: tuple[int, int], fields: frozenset[str]) -> SamplerChoice:
    """The sampler for this release (see the module docstring)."""
    if version < (1, 3):
        if "enable_trtllm_sampler" in fields:  # 1.0
            return SamplerChoice({"enable_trtllm_sampler": True}, "TRTLLMSampler", ())
        if "sampler_type" in fields:  # 1.1, 1.2
            return SamplerChoice({"sampler_type": "TRTLLMSampler"}, "TRTLLMSampler", ())
        raise EngineUnavailableError(
            f"TensorRT-LLM {'.'.join(map(str, version))} has neither enable_trtllm_sampler nor "
            f"sampler_type: refusing to start rather than sample with a sampler that drops fields"
        )
    kwargs = {"sampler_type": "TorchSampler"} if "sampler_type" in fields else {}
    return SamplerChoice(kwargs, "TorchSampler", ("seed",))


def cache_options(trt: ModuleType) -> tuple[dict[str, Any], bool]:
    """`LLM(...)` arguments that keep owners' prefix caches apart, and whether each request is
    to be salted with its owner (see the module docstring)."""
    try:
        parameters = inspect.signature(trt.LLM.generate_async).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    if "cache_salt" in parameters:
        return {}, True
    config = importlib.import_module("tensorrt_llm.llmapi").KvCacheConfig
    return {"kv_cache_config": config(enable_block_reuse=False)}, False


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
    which not every backend accepts. A sampled request without a seed gets a fresh random one
    (the TRTLLM sampler would use 0, see the module docstring). Stop strings are left out on
    purpose (see `app.engine.trtllm.engine`).
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
    elif not params.greedy:
        kwargs["seed"] = random.getrandbits(63)
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
