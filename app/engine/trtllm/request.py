"""One request as the adapter follows it through TensorRT-LLM: its prompt until handed over, its
`RequestOutput` after, and the ways it can end on TensorRT-LLM's side."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from app.engine.base import FinishReason
from app.engine.requests import RequestState
from app.engine.trtllm.errors import backend_ending

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class TrtRequest(RequestState):
    token_ids: list[int] | None = None  # the prompt, until handed to TensorRT-LLM
    trt_params: Any = None  # its tensorrt_llm SamplingParams
    output: Any = None  # its tensorrt_llm RequestOutput, once handed over
    responses: int = 0  # responses TensorRT-LLM has sent: 0 means it may still be queued
    abort_sent: bool = False  # RequestOutput.abort() was called
    stop_string: bool = False  # we ended it on a stop string
    task: asyncio.Task[None] | None = None

    def end_as_backend_said(self, trt_reason: str | None) -> None:
        """TensorRT-LLM says the request is over: end our stream the way it ended."""
        if self.aborted:
            self.finish(FinishReason.CANCELLED)
        else:
            self.finish(*backend_ending(trt_reason))

    def abort_backend(self) -> None:
        """`RequestOutput.abort()`, once, if TensorRT-LLM has it and it has not finished."""
        if self.output is None or self.abort_sent or self.output.finished:
            return
        self.abort_sent = True
        try:
            self.output.abort()
        except Exception as exc:  # the request may be ending on its own just now
            log.debug("RequestOutput.abort() for %s failed: %r", self.request_id, exc)
