"""One request of ENGINE=openai as the engine tracks it: its output side (`RequestState`) and its
place among the upstreams.

OpenAI streams carry text, not token ids: each chunk with text counts as one token (llama-server,
vLLM and trtllm-serve send one per decoded token) with the id `UNKNOWN_TOKEN`, and the final
`usage` chunk, when the upstream sends it, gives the exact counts (`take_usage`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from app.engine.base import SamplingParams
from app.engine.openai.sampling import sampling_fields
from app.engine.openai.upstreams import Upstream
from app.engine.requests import RequestState

UNKNOWN_TOKEN = -1


@dataclass(eq=False, slots=True)
class UpstreamRequest(RequestState):
    body: dict[str, Any]  # the chat-completions request but its sampling fields
    params: SamplingParams
    task: asyncio.Task[None] | None = None
    admitted: asyncio.Future[Upstream | None] | None = None  # while it waits for a slot
    upstream: Upstream | None = None  # the one whose slot it holds
    tried: list[Upstream] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    usage: dict[str, int] | None = None

    def body_for(self, upstream: Upstream) -> dict[str, Any]:
        """The request as `upstream` reads it: its own names for the sampling fields."""
        return {**self.body, **sampling_fields(self.params, upstream.server)}

    def take_text(self, text: str, now: float) -> bool:
        """One chunk's text through the stop strings; True if one was hit (the reply ends)."""
        return self.tokens((UNKNOWN_TOKEN,), text, now)

    def take_usage(self) -> None:
        """The upstream's own counts, where it sent them, for the `Finished` (chunks at least)."""
        usage = self.usage or {}
        self.prompt_tokens = int(usage.get("prompt_tokens", 0))
        self.completion_tokens = max(int(usage.get("completion_tokens", 0)), self.completion_tokens)
