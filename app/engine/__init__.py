"""Inference engines behind one contract (`app.engine.base`). Nothing here knows HTTP or SQL."""

from __future__ import annotations

from app.engine.base import (
    ChatMessages,
    Engine,
    EngineError,
    EngineEvent,
    EngineStats,
    EngineUnavailableError,
    Finished,
    FinishReason,
    PromptTooLongError,
    SamplingParams,
    TextDelta,
)
from app.settings import EngineSettings

__all__ = [
    "ChatMessages",
    "Engine",
    "EngineError",
    "EngineEvent",
    "EngineStats",
    "EngineUnavailableError",
    "FinishReason",
    "Finished",
    "PromptTooLongError",
    "SamplingParams",
    "TextDelta",
    "create_engine",
]


def create_engine(settings: EngineSettings) -> Engine:
    """Build the engine the settings name. Heavy imports happen only for the chosen one."""
    if settings.kind == "llamacpp":
        from app.engine.llamacpp.engine import LlamaCppEngine

        return LlamaCppEngine(settings)
    if settings.kind == "synthetic":
        from app.engine.synthetic.engine import SyntheticEngine

        return SyntheticEngine(settings)
    if settings.kind == "trtllm":
        from app.engine.trtllm.engine import TrtLlmEngine

        return TrtLlmEngine(settings)
    if settings.kind == "openai":
        from app.engine.openai.engine import OpenAIRemoteEngine

        return OpenAIRemoteEngine(settings)
    if settings.kind == "process":
        from app.engine.process.client import EngineProcessClient

        return EngineProcessClient(settings)
    raise ValueError(
        f"unknown ENGINE {settings.kind!r}: choose llamacpp, trtllm, openai, synthetic or process"
    )
