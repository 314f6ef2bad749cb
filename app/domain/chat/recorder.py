"""The streaming core's `Recorder`, over the reply rows: how a reply reaches the database."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from app.db.session import Sessions, transaction
from app.domain.chat.reply_rows import FINAL_UPDATE, PROGRESS_UPDATE, final_params, progress_params
from app.streaming.generation import Outcome
from app.streaming.manager import Progress


class DatabaseRecorder:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def save_progress(self, progress: Sequence[Progress]) -> None:
        """Every running reply's partial text, in ONE transaction (one fsync, one write lock)."""
        if not progress:
            return
        params = [
            progress_params(UUID(item.message_id), item.text, item.completion_tokens)
            for item in sorted(progress, key=lambda p: p.message_id)  # lock order: see below
        ]
        async with transaction(self.sessions) as session:
            await session.execute(PROGRESS_UPDATE, params)

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        """Several replies' ends in ONE transaction (one executemany), each its `Outcome` as it
        is: all saved, or none.

        Both batches lock their rows in message-id order: a progress flush and a batch of ends
        running at once on PostgreSQL would otherwise each hold a row the other waits for
        ("deadlock detected", seen under a burst of 256), and one of them would be rolled back."""
        params = [final_params(o) for o in sorted(outcomes, key=lambda o: o.message_id)]
        async with transaction(self.sessions) as session:
            await session.execute(FINAL_UPDATE, params)
