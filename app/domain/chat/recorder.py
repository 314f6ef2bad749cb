"""The streaming core's `Recorder`, over the chat service: how a reply reaches the database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from app.db.session import Sessions, transaction
from app.domain.chat import service
from app.streaming.generation import Outcome
from app.streaming.manager import Progress


def _final_update(outcome: Outcome) -> Any:
    return service.finish_update(
        UUID(outcome.message_id),
        outcome.status.value,
        content=outcome.text,
        finish_reason=outcome.finish_reason,
        usage=service.Usage(outcome.prompt_tokens, outcome.completion_tokens),
        timings=service.Timings.from_epoch(
            queued_at=outcome.queued_at,
            first_token_at=outcome.first_token_at,
            finished_at=outcome.finished_at,
            ttft_ms=outcome.ttft_ms,
            gap_p50_ms=outcome.gap_p50_ms,
            gap_p99_ms=outcome.gap_p99_ms,
        ),
        error=outcome.error,
        cancel=service.CancelInfo(outcome.cancel_token_index, outcome.tokens_after_cancel),
    )


class DatabaseRecorder:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def save_progress(self, progress: Sequence[Progress]) -> None:
        """Every running reply's partial text, in ONE transaction (one fsync, one write lock)."""
        async with transaction(self.sessions) as session:
            for item in progress:
                await session.execute(
                    service.progress_update(
                        UUID(item.message_id), item.text, item.completion_tokens
                    )
                )

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        """Several replies' ends in ONE transaction: all saved, or none."""
        async with transaction(self.sessions) as session:
            for outcome in outcomes:
                await session.execute(_final_update(outcome))
