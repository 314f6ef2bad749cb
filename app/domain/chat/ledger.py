"""The streaming core's `ReplyLedger` (app/streaming/ledger.py) over the reply rows and the cancel
channel: how a reply reaches the database, is read back, and is stopped on another replica."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from app.db.cancel_channel import CancelChannel
from app.db.session import Sessions, transaction
from app.domain.chat import reply_rows
from app.domain.quotas import counter
from app.domain.quotas.service import Quotas
from app.streaming.generation import Outcome
from app.streaming.ledger import Action, Progress


class DatabaseLedger:
    def __init__(
        self,
        sessions: Sessions,
        channel: CancelChannel,
        replica_id: str | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        """`replica_id`: this process's replica (None: a single-process deployment), whose rows
        left streaming `close_interrupted` closes. `quotas`: whose reservations the ends settle."""
        self.sessions = sessions
        self.channel = channel
        self.replica_id = replica_id
        self.quotas = quotas

    async def save_progress(self, progress: Sequence[Progress]) -> None:
        """Every running reply's partial text, in ONE transaction (one fsync, one write lock)."""
        if not progress:
            return
        params = [
            reply_rows.progress_params(UUID(item.message_id), item.text, item.completion_tokens)
            for item in sorted(progress, key=lambda p: p.message_id)  # lock order: see below
        ]
        async with transaction(self.sessions) as session:
            await session.execute(reply_rows.PROGRESS_UPDATE, params)

    async def save_finals(self, outcomes: Sequence[Outcome]) -> None:
        """Several replies' ends in ONE transaction (one executemany), each its `Outcome` as it
        is: all saved, or none.

        Both batches lock their rows in message-id order: a progress flush and a batch of ends
        running at once on PostgreSQL would otherwise each hold a row the other waits for
        ("deadlock detected", seen under a burst of 256), and one of them would be rolled back.

        The same transaction settles the replies' token quotas (app/domain/quotas/service.py):
        counted once, with the end, whatever the end is."""
        params = [reply_rows.final_params(o) for o in sorted(outcomes, key=lambda o: o.message_id)]
        settle = self.quotas.settlements(outcomes) if self.quotas is not None else []
        async with transaction(self.sessions) as session:
            await session.execute(reply_rows.FINAL_UPDATE, params)
            await counter.add(session, sorted(settle, key=lambda p: (str(p["user"]), p["day"])))
        if self.quotas is not None:
            self.quotas.settled(outcomes)

    async def load(self, message_id: str) -> Outcome | None:
        message = await reply_rows.get_message_unscoped(self.sessions, UUID(message_id))
        return None if message is None else reply_rows.stored_outcome(message)

    async def publish(self, message_id: str, action: Action) -> None:
        await self.channel.publish(message_id, str(action))

    async def close_interrupted(self) -> int:
        return await reply_rows.mark_interrupted_at_startup(self.sessions, self.replica_id)
