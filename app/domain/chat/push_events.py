"""What one page of a user hears about the user's other pages: a reply started or ended, a
conversation created, renamed, filed (pinned or archived, or back) or deleted, another version of
one shown. Small events, published after the write they report has committed, to every open page
of that user only (app/streaming/push.py keeps the channels).

A page that hears `reply_started` for the conversation it shows resumes that reply the usual way
(`ReplyService.resume`, from offset 0): the text itself only ever travels through the streaming
core. Both transports carry these events: the WebSocket as `{"type": "event", "event": ...}`
frames, `GET /api/events` as server-sent events named after `event`.

Across replicas, each event is also relayed to the others (on PostgreSQL through NOTIFY:
app/db/broadcast.py), which deliver it to their own pages of that user (`receive`). A page that
connects hears the replies live in its own replica at once; those running on another replica it
hears of when they start (or on its next load).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from uuid import UUID

import msgspec

from app.streaming.generation import Generation
from app.streaming.manager import GenerationManager
from app.streaming.push import EVICTED, PushChannel, PushHub

log = logging.getLogger(__name__)


class ReplyStarted(msgspec.Struct, tag_field="event", tag="reply_started"):
    conversation_id: str
    message_id: str


class ReplyEnded(msgspec.Struct, tag_field="event", tag="reply_ended"):
    conversation_id: str
    message_id: str
    status: str


class ConversationCreated(msgspec.Struct, tag_field="event", tag="conversation_created"):
    conversation_id: str
    title: str


class ConversationRenamed(msgspec.Struct, tag_field="event", tag="conversation_renamed"):
    conversation_id: str
    title: str


class ConversationFiled(msgspec.Struct, tag_field="event", tag="conversation_filed"):
    """Pinned, unpinned, archived or unarchived: where it belongs in the list now."""

    conversation_id: str
    title: str
    updated_at: str
    pinned_at: str | None
    archived_at: str | None


class ConversationDeleted(msgspec.Struct, tag_field="event", tag="conversation_deleted"):
    conversation_id: str


class BranchShown(msgspec.Struct, tag_field="event", tag="branch_shown"):
    """Another version is shown (a page switched it): the pages showing the conversation
    re-render it, so that what they show, and send after, is the branch ending at `leaf_id`."""

    conversation_id: str
    leaf_id: str | None


class Resync(msgspec.Struct, tag_field="event", tag="resync", omit_defaults=True):
    """Events were dropped (the page fell behind, or just connected): refetch what it shows.
    `reason` "evicted": this channel was ended, the user's newer ones pushed it out (past
    PUSH_MAX_CHANNELS_PER_USER); the page should not reconnect it, nor expect more events on it."""

    reason: str | None = None


class SignedOut(msgspec.Struct, tag_field="event", tag="signed_out"):
    """The account was signed out everywhere (`reason`: disabled, deleted, password_reset or
    logged_out): the channel ends after this, and the page goes to the log-in page."""

    reason: str


PushEvent = (
    ReplyStarted
    | ReplyEnded
    | ConversationCreated
    | ConversationRenamed
    | ConversationFiled
    | ConversationDeleted
    | BranchShown
    | Resync
    | SignedOut
)


class UserPush:
    """Publishes a user's events to that user's pages, and streams them to one page (`page_events`)."""

    def __init__(
        self,
        hub: PushHub[PushEvent],
        manager: GenerationManager,
        relay: Callable[[str, str], None] | None = None,
    ) -> None:
        """`relay(user_id, event as JSON)`: tells the other replicas (app/db/broadcast.py)."""
        self.hub = hub
        self.manager = manager
        self.relay = relay
        # Another replica's sign-out of a user (app/domain/chat/sign_outs.py), applied here.
        self.on_signed_out: Callable[[str, SignedOut], None] | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    def publish(self, user_id: UUID | str, event: PushEvent) -> None:
        self.hub.publish(str(user_id), event)
        if self.relay is not None:
            self.relay(str(user_id), _encode(event).decode())

    def tell_others(self, user_id: UUID | str, event: PushEvent) -> None:
        """Relay `event` to the other replicas only (a sign-out, which each applies itself)."""
        if self.relay is not None:
            self.relay(str(user_id), _encode(event).decode())

    def receive(self, user_id: str, payload: str) -> None:
        """An event another replica published: to this replica's pages of that user."""
        try:
            event = _decode(payload)
        except msgspec.DecodeError:  # not an event this version knows (a mixed-version roll-out)
            log.warning("ignoring a relayed push event %r", payload[:200])
            return
        if isinstance(event, SignedOut):
            if self.on_signed_out is not None:
                self.on_signed_out(user_id, event)
            return
        self.hub.publish(user_id, event)

    def reply_started(self, generation: Generation) -> None:
        """Announce a page reply that just went live, and its end once that is saved."""
        self.publish(generation.user_id, _started(generation))
        task = asyncio.create_task(self._announce_end(generation), name="push-reply-end")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _announce_end(self, generation: Generation) -> None:
        await generation.wait_done()
        ended = ReplyEnded(
            generation.conversation_id, generation.message_id, generation.status.value
        )
        self.publish(generation.user_id, ended)

    def close(self) -> None:
        """At shutdown: stop waiting for the ends of replies (the process goes with them)."""
        for task in self._watchers:
            task.cancel()

    def live_replies(self, user_id: UUID | str) -> list[ReplyStarted]:
        """The user's page replies generating here now: what a page that just connected missed."""
        return [
            _started(g)
            for g in self.manager.live()
            if g.user_id == str(user_id) and g.source == "page" and g.outcome is None
        ]

    async def page_events(
        self,
        user_id: UUID | str,
        keepalive_s: float,
        subscribed: Callable[[PushChannel[PushEvent]], None] | None = None,
    ) -> AsyncGenerator[PushEvent | None, None]:
        """One page's events: a heartbeat (None) as soon as it is subscribed (the page then knows
        it hears everything from here on), the replies live now, then each event as it comes
        (Resync when some were dropped), and None after `keepalive_s` of silence. It ends after a
        Resync "evicted" (past the user's cap of channels) or a SignedOut."""
        with self.hub.subscribe(str(user_id)) as channel:
            if subscribed is not None:
                subscribed(channel)  # app/domain/chat/sign_outs.py ends it with its session
            yield None
            for started in self.live_replies(user_id):
                yield started
            async for event in channel.events(keepalive_s):
                if event == EVICTED:
                    yield Resync(reason="evicted")
                elif isinstance(event, str):
                    yield Resync()
                else:
                    yield event


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(PushEvent).decode


def _started(generation: Generation) -> ReplyStarted:
    return ReplyStarted(generation.conversation_id, generation.message_id)
