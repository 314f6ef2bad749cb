"""The streaming core's `ReplyStore` (app/streaming/store.py) over the chat rows and the cancel
channel: how a reply that is not live here is followed and stopped."""

from __future__ import annotations

from uuid import UUID

from app.db.cancel_channel import CancelChannel
from app.db.session import Sessions
from app.domain.chat import reply_rows
from app.streaming.generation import Outcome
from app.streaming.store import Action


class DatabaseReplyStore:
    def __init__(self, sessions: Sessions, channel: CancelChannel) -> None:
        self.sessions = sessions
        self.channel = channel

    async def load(self, message_id: str) -> Outcome | None:
        message = await reply_rows.get_message_unscoped(self.sessions, UUID(message_id))
        return None if message is None else reply_rows.stored_outcome(message)

    async def publish(self, message_id: str, action: Action) -> None:
        await self.channel.publish(message_id, str(action))
