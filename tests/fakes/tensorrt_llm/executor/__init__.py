"""FAKE tensorrt_llm.executor (see the package docstring): what the adapter imports from it."""

from .utils import RequestError

__all__ = ["RequestError"]
