"""The streaming core's `Recorder`, over the reply rows: how a reply reaches the database."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from app.db.session import Sessions, transaction
from app.domain.chat.reply_rows import final_update, progress_update
from app.streaming.generation import Outcome
from app.streaming.manager import Progress


class DatabaseRecorder:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def save_progress(self, progress: Sequence[Progress]) -> None:
        """Every running reply's partial text, in ONE transaction (one fsync, one write lock)."""
        async with transaction(self.sessions) as session:
            for item in progress:
                await session.execute(
                    progress_update(UUID(item.message_id), item.text, item.completion_tokens)
                )

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        """Several replies' ends in ONE transaction, each its `Outcome` as it is: all saved, or
        none."""
        async with transaction(self.sessions) as session:
            for outcome in outcomes:
                await session.execute(final_update(outcome))
