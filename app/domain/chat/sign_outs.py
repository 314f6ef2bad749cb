"""Signing a user out of every open connection at once, on every replica.

Disabling, deleting, "log out everywhere" and a password reset end the user's sessions (the
account's row changes: app/domain/accounts/management.py, links.py), which every HTTP request
notices within a second (app/domain/accounts/access.py). What lives on without making requests
is ended here, at once:
- their running replies are stopped (`CancelCause.SIGNED_OUT`, saved `cancelled`) — all of them
  when the account is disabled, deleted or its password reset; only the pages' ones for "log out
  everywhere", which leaves the API keys (and the `/v1` calls made with them) alone;
- their push channels (`GET /api/events`, WebSocket subscriptions) hear `signed_out` and end
  (`page_events`: a `GET /api/events` stream is watched like a socket);
- their WebSockets send what their replies still have to say (the `final`s), then close with
  4401, which the page answers by going to the log-in page.

When the user ends some of their own sessions and keeps the account (a password change or "log
out all others" ends all but this one; "log out" on one session ends that one), `end_sessions`
closes those sessions' sockets and push channels at once, here and on the other replicas
(`SessionsEnded`), and leaves the current session's open: they take the account's new epoch.
Their replies run on (a reply knows its user, not its session).

The replica where the admin acted does this at once and tells the others through the users'
event relay (`SignedOut` is a push event: app/domain/chat/push/events.py; on PostgreSQL the
relay is NOTIFY, app/db/broadcast.py), and each does the same for its own connections and replies.
A NOTIFY can be lost (the listening connection was being re-opened), and an account can be
changed with no server to tell (straight in the database), so each replica also re-checks, once a
second, the accounts of the users it has sockets or live replies for (through the access cache:
one read per user and second at most, shared with the requests): a disabled or deleted account
is signed out here, and a socket whose session's epoch is behind the account's is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from uuid import UUID

from app.domain.accounts.access import AccessCache
from app.domain.accounts.models import UserState
from app.domain.chat.push.events import PushEvent, SessionsEnded, SignedOut, UserPush
from app.streaming.events import CancelCause
from app.streaming.manager import GenerationManager
from app.streaming.push import PushChannel

log = logging.getLogger(__name__)

SWEEP_S = 1.0


@dataclass(eq=False, slots=True)
class Connection:
    """One open socket (or event stream) of a user: its session's epoch and row, and how to end
    it."""

    epoch: int
    close: Callable[[str], None]  # (reason): returns at once; the socket ends in its own time
    session: str | None = None  # the session's row (None: a session from before the list)
    closing: bool = False

    def end(self, reason: str) -> None:
        if not self.closing:
            self.closing = True
            self.close(reason)


class SignOuts:
    def __init__(
        self,
        manager: GenerationManager,
        push: UserPush,
        access: AccessCache | None = None,
        sweep_s: float = SWEEP_S,
    ) -> None:
        self.manager = manager
        self.push = push
        self.access = access
        self.sweep_s = sweep_s
        self._sockets: dict[str, dict[Connection, None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        push.on_signed_out = lambda user_id, event: self.apply(user_id, event.reason)
        push.on_sessions_ended = self.apply_sessions_ended

    @contextlib.contextmanager
    def watch(
        self,
        user_id: UUID | str,
        epoch: int,
        close: Callable[[str], None],
        session: UUID | None = None,
    ) -> Iterator[None]:
        """Register one socket of the user (opened by the session whose row is `session`) for as
        long as the block runs."""
        connection = Connection(epoch, close, None if session is None else str(session))
        mine = self._sockets.setdefault(str(user_id), {})
        mine[connection] = None
        try:
            yield
        finally:
            mine.pop(connection, None)
            if not mine and self._sockets.get(str(user_id)) is mine:
                del self._sockets[str(user_id)]

    async def page_events(
        self, user_id: UUID | str, epoch: int, keepalive_s: float, session: UUID | None = None
    ) -> AsyncGenerator[PushEvent | None, None]:
        """`UserPush.page_events` for `GET /api/events`, watched like a socket: it ends (with
        `signed_out`) when the session it was opened with ends."""
        channels: list[PushChannel[PushEvent]] = []

        def end(reason: str) -> None:
            for channel in channels:
                channel.end(SignedOut(reason))

        events = self.push.page_events(user_id, keepalive_s, subscribed=channels.append)
        with self.watch(user_id, epoch, end, session):
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event

    def sign_out(self, user_id: UUID | str, reason: str) -> None:
        """After the account's change is committed: end everything of the user's, here and on
        every other replica."""
        self.push.tell_others(user_id, SignedOut(reason))
        self.apply(str(user_id), reason)

    def apply(self, user_id: str, reason: str) -> None:
        """End this replica's replies, push channels and sockets of the user."""
        if self.access is not None:
            self.access.forget(UUID(user_id))  # this replica's next request reads the row again
        stopped = 0
        for generation in self.manager.live():
            if generation.user_id != user_id or generation.outcome is not None:
                continue
            if reason == "logged_out" and generation.source != "page":
                continue  # "log out everywhere" leaves the API keys' calls running
            stopped += generation.cancel(CancelCause.SIGNED_OUT)
        channels = self.push.hub.end_user(user_id, SignedOut(reason))
        sockets = [c for c in self._sockets.get(user_id, ()) if not c.closing]
        for connection in sockets:
            connection.end(reason)
        if stopped or channels or sockets:
            log.info(
                "signed out %s (%s): %d replies stopped, %d push channels, %d connections ended",
                user_id,
                reason,
                stopped,
                channels,
                len(sockets),
            )

    def end_sessions(
        self,
        user_id: UUID | str,
        *,
        only: UUID | None = None,
        keep: UUID | None = None,
        epoch: int | None = None,
    ) -> None:
        """After some of the user's sessions ended (committed): `only` that one, or every one but
        `keep`, which goes on under the account's new `epoch`. Closes their sockets and push
        channels here and on every other replica; the account stays."""
        event = SessionsEnded(
            only=None if only is None else str(only),
            keep=None if keep is None else str(keep),
            epoch=epoch,
        )
        self.push.tell_others(user_id, event)
        self.apply_sessions_ended(str(user_id), event)

    def apply_sessions_ended(self, user_id: str, event: SessionsEnded) -> None:
        """End this replica's sockets of the sessions that `event` ended."""
        ended = 0
        for connection in list(self._sockets.get(user_id, ())):
            if connection.closing:
                continue
            if event.only is not None:
                gone = connection.session == event.only
            else:
                gone = event.keep is None or connection.session != event.keep
            if gone:
                connection.end("logged_out")
                ended += 1
            elif event.only is None and event.epoch is not None:
                connection.epoch = event.epoch  # the kept session's: current, not behind
        if ended:
            log.info("sessions of %s ended: %d connections closed", user_id, ended)

    def connection_count(self, user_id: UUID | str | None = None) -> int:
        """Sockets and `GET /api/events` streams watched here."""
        if user_id is not None:
            return len(self._sockets.get(str(user_id), ()))
        return sum(len(s) for s in self._sockets.values())

    # -- the once-a-second check, for what no message said -------------------------------------

    def start(self) -> None:
        if self.access is not None and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="sign-out-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("the sign-out check failed; retrying in %.1f s", self.sweep_s)

    async def sweep(self) -> None:
        """Sign out the users with sockets or live replies here whose account is gone or
        disabled; close the sockets opened with a session that has ended since."""
        assert self.access is not None
        users = set(self._sockets)
        users.update(g.user_id for g in self.manager.live() if g.outcome is None)
        for user_id in users:
            try:
                access = await self.access.get(UUID(user_id))
            except Exception:
                continue  # the database cannot be read: nothing is known to have changed
            if access is None:
                self.apply(user_id, "deleted")
            elif access.state == UserState.DISABLED:
                self.apply(user_id, "disabled")
            else:
                for connection in list(self._sockets.get(user_id, ())):
                    if connection.epoch != access.epoch:
                        connection.end("logged_out")
