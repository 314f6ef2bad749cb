"""One request of ENGINE=openai as the engine tracks it, and the events it makes.

OpenAI streams carry text, not token ids: each chunk with text counts as one token (llama-server,
vLLM and trtllm-serve send one per decoded token) with the id `UNKNOWN_TOKEN`, and the final
`usage` chunk, when the upstream sends it, gives the exact counts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from app.engine.base import Finished, FinishReason, TextDelta
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.openai.upstreams import Upstream
from app.engine.streams import EventStream

UNKNOWN_TOKEN = -1


@dataclass(eq=False, slots=True)
class UpstreamRequest:
    request_id: str
    body: dict[str, Any]  # the chat-completions request, the same for every upstream tried
    owner: str | None
    stream: EventStream
    detok: IncrementalDetokenizer  # the stop strings, applied here too
    queued_at: float
    task: asyncio.Task[None] | None = None
    admitted: asyncio.Future[Upstream | None] | None = None  # while it waits for a slot
    upstream: Upstream | None = None  # the one whose slot it holds
    tried: list[Upstream] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    admitted_at: float | None = None
    first_token_at: float | None = None
    chunks: int = 0  # chunks with text received: tokens, as far as the stream shows
    pending: int = 0  # of those, the ones whose text is held back (a possible stop string)
    usage: dict[str, int] | None = None
    done: bool = False

    def take_text(self, text: str) -> bool:
        """One chunk's text through the stop strings; True if one was hit (the reply ends)."""
        self.chunks += 1
        self.pending += 1
        shown, stopped = self.detok.push(text)
        self.emit(shown)
        return stopped

    def emit(self, text: str) -> None:
        if text:
            self.stream.push(TextDelta(text=text, token_ids=(UNKNOWN_TOKEN,) * self.pending))
            self.pending = 0

    def finished(self, reason: FinishReason, error: str | None) -> Finished:
        usage = self.usage or {}
        return Finished(
            reason=reason,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=max(int(usage.get("completion_tokens", 0)), self.chunks),
            queued_at=self.queued_at,
            first_token_at=self.first_token_at,
            finished_at=time.time(),
            error=error,
            admitted_at=self.admitted_at,
        )
