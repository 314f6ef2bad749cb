"""A reply that is not live in this process, read and stopped through the ledger, by polling it.

The database-polling counterpart of a Subscriber (app/streaming/subscriber.py), with the same
events: Start at the resume offset, Deltas whose ids are character offsets, the Final, and None
for "nothing to say for keepalive_s". A finished reply replays to its end; one streaming on
another replica is re-read every `poll_s` until it ends there, and the replica running it is told
now and then that a client still watches it (ATTACH), so the disconnect grace it started when
that client left restarts. It reads and publishes through the `ReplyLedger` port (app/streaming/ledger.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from app.streaming.events import CancelCause, Delta, Start, Status, StreamEvent
from app.streaming.generation import Outcome, final_from_outcome
from app.streaming.ledger import ATTACH, ReplyLedger

STORED_POLL_S = 0.5
"""How often a reply streaming on another replica is re-read from the store."""

STOP_POLL_S = 0.05
"""How often a reply stopped on another replica is re-read until its end is stored."""


class ReplyPoller:
    def __init__(
        self,
        store: ReplyLedger,
        *,
        grace_s: float,
        poll_s: float = STORED_POLL_S,
        stop_poll_s: float = STOP_POLL_S,
    ) -> None:
        """`grace_s`: how long the replica running a reply waits for a client that left (a
        page's grace): a client watching from here is reported three times within it."""
        self.store = store
        self.poll_s = poll_s
        self.stop_poll_s = stop_poll_s
        self.attach_every_s = max(poll_s, grace_s / 3)

    async def events(
        self, reply: Outcome, *, conversation_id: str, after: int, keepalive_s: float
    ) -> AsyncGenerator[StreamEvent | None, None]:
        """Start, the text since offset `after` as the store has it and as it grows, then Final.

        `reply` is the reply as stored when the client asked. A reply deleted meanwhile ends the
        stream without a Final.
        """
        # A finished reply's offset is clamped to its text, as a Subscriber's is. One streaming
        # elsewhere may be stored behind what the client already has (it is flushed about once
        # a second there): its text then resumes from the client's offset once the store has it.
        if reply.status == Status.STREAMING:
            cursor = max(0, after)
        else:
            cursor = max(0, min(after, len(reply.text)))
        yield Start(id=cursor, message_id=reply.message_id, conversation_id=conversation_id)
        idle = since_attach = 0.0
        while True:
            if len(reply.text) > cursor:
                yield Delta(id=len(reply.text), text=reply.text[cursor:])
                cursor, idle = len(reply.text), 0.0
            if reply.status != Status.STREAMING:
                yield final_from_outcome(reply)
                return
            if since_attach <= 0:
                await self.store.publish(reply.message_id, ATTACH)
                since_attach = self.attach_every_s
            await asyncio.sleep(self.poll_s)
            idle += self.poll_s
            since_attach -= self.poll_s
            if idle >= keepalive_s:
                idle = 0.0
                yield None
            latest = await self.store.load(reply.message_id)
            if latest is None:  # deleted meanwhile
                return
            reply = latest

    async def stop(self, message_id: str, cause: CancelCause, wait_s: float) -> str:
        """Ask the replica running the reply to stop it, and watch the store for its end.

        Returns its end status once stored, "deleted" if the row went, or "streaming" if neither
        happened within `wait_s`.
        """
        await self.store.publish(message_id, cause)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while loop.time() < deadline:
            await asyncio.sleep(self.stop_poll_s)
            latest = await self.store.load(message_id)
            if latest is None:
                return "deleted"
            if latest.status != Status.STREAMING:
                return str(latest.status)
        return "streaming"
