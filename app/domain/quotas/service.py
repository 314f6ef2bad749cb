"""The quotas in force, the refusal, and the reservations this process's live replies hold.

A reply reserves its most tokens when it starts (`reserve`: refused with QuotaExceededError once
the user's day or month is used up) and settles to what the engine reported when its end is
saved, in the same transaction (`settlements`, run by the ledger: app/domain/chat/replies/ledger.py), so
every reply that reached the engine is counted once, whatever its end: completed, cancelled,
disconnected, failed, or interrupted by a shutdown. A reply whose start fails after its
reservation gives it back (`release`). The limit: a process that dies with replies running
leaves their reservations counted for their day.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from uuid import UUID

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.errors import DomainError
from app.domain.quotas import counter
from app.streaming.generation import Outcome
from app.streaming.manager import Persist, ReplyRows

LOW_SHARE = 0.10
"""Below this share of a limit left, the page says how much is left."""


def _start_of_next_day(today: date) -> datetime:
    return datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)


def _start_of_next_month(today: date) -> datetime:
    first = today.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return datetime.combine(following, datetime.min.time(), UTC)


def _in_words(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days} d"] if days else []
    parts += [f"{hours} h"] if hours else []
    parts += [f"{minutes} min"] if minutes and not days else []
    return " ".join(parts)


class QuotaExceededError(DomainError):
    """The user's tokens for this UTC day (or month) are used up: refused until it resets.

    `/v1` answers it as OpenAI does an exhausted quota (type and code `insufficient_quota`)."""

    status = 429

    def __init__(self, period: str, limit: int, resets_at: datetime, now: datetime) -> None:
        self.period = period  # "day" or "month"
        self.limit = limit
        self.resets_at = resets_at
        self.retry_after_s = max(1, int((resets_at - now).total_seconds()) + 1)
        when = resets_at.strftime("%Y-%m-%d %H:%M UTC")
        super().__init__(
            f"you have used your token quota for this {period} ({limit:,} tokens): it resets "
            f"at {when} (in {_in_words(self.retry_after_s)})"
        )

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


Overrides = tuple[int | None, int | None]
"""A user's own limits per day and per month, as their row holds them (None: the default)."""


@dataclass(frozen=True, slots=True)
class Limits:
    per_day: int  # 0: no limit
    per_month: int

    @property
    def any(self) -> bool:
        return self.per_day > 0 or self.per_month > 0

    def apply(self, per_day: int | None, per_month: int | None) -> Limits:
        """These defaults under a user's overrides (None: the default)."""
        return Limits(
            self.per_day if per_day is None else per_day,
            self.per_month if per_month is None else per_month,
        )


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """A user's quotas as they stand (the page's `/api/quota`, the users page)."""

    limits: Limits
    used_day: int
    used_month: int
    day_resets_at: datetime
    month_resets_at: datetime

    def left(self, limit: int, used: int) -> int | None:
        return None if limit <= 0 else max(0, limit - used)

    def view(self) -> QuotaView:
        day = self.left(self.limits.per_day, self.used_day)
        month = self.left(self.limits.per_month, self.used_month)
        low = any(
            left is not None and left < LOW_SHARE * limit
            for left, limit in ((day, self.limits.per_day), (month, self.limits.per_month))
        )
        return QuotaView(
            per_day=self.limits.per_day or None,
            per_month=self.limits.per_month or None,
            used_day=self.used_day,
            used_month=self.used_month,
            left_day=day,
            left_month=month,
            day_resets_at=self.day_resets_at,
            month_resets_at=self.month_resets_at,
            low=low,
        )


class QuotaView(msgspec.Struct, frozen=True):
    """`GET /api/quota`: limits in force (null: none), tokens used (replies still running count
    what they reserved) and left, when each resets, and `low` below a tenth left of either."""

    per_day: int | None
    per_month: int | None
    used_day: int
    used_month: int
    left_day: int | None
    left_month: int | None
    day_resets_at: datetime
    month_resets_at: datetime
    low: bool


@dataclass(frozen=True, slots=True)
class Reservation:
    user_id: UUID
    day: date  # the UTC day it is counted in (the reply's start), settled there too
    tokens: int  # reserved; 0 when the user has no limit (the reply's use is added at its end)


@dataclass(frozen=True, slots=True)
class Admission:
    """What `Quotas.check` read before a reply's start, for `Quotas.take`."""

    user_id: UUID
    now: datetime
    # None: nothing to reserve (no limit in force, or no such user: the send's own query says so)
    state: QuotaStatus | None


@dataclass(slots=True)
class Admitted:
    """A reply let through: the `persist` to start it with, and its reservation once taken."""

    quotas: Quotas
    persist: Persist
    reservation: Reservation | None
    own_transaction: bool = True

    async def release(self) -> None:
        """The reply did not start: give back a reservation taken in a transaction of its own
        (one taken in the caller's is rolled back with it)."""
        if self.reservation is not None and self.own_transaction:
            await self.quotas.release(self.reservation)

    def hold(self, message_id: str) -> None:
        """The reply started as `message_id`: settle its reservation with its final save."""
        if self.reservation is not None:
            self.quotas.hold(message_id, self.reservation)


TEMPLATE_ALLOWANCE = 64
"""Tokens a chat template may add on its own (SmolLM2's adds a default system prompt of about 20,
and its markers); a template that adds more can make a reply overshoot by the difference."""


def reply_bound(messages: Sequence[Mapping[str, str]], max_tokens: int, context_size: int) -> int:
    """The most tokens a reply can use, prompt included: a token spans at least one byte of text,
    the template adds its markers (8 a message) and `TEMPLATE_ALLOWANCE`, and prompt and reply
    share the context (the engine refuses a prompt that does not fit)."""
    prompt = sum(len(m.get("content", "").encode()) + 8 for m in messages) + TEMPLATE_ALLOWANCE
    return max(1, min(context_size, prompt + max_tokens))


class Quotas:
    def __init__(
        self, sessions: Sessions, defaults: Limits, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.sessions = sessions
        self.defaults = defaults
        self.clock = clock  # UTC now (the tests move it)
        self._held: dict[str, Reservation] = {}  # message id -> its reply's reservation

    async def status(self, user_id: UUID, now: datetime | None = None) -> QuotaStatus | None:
        """The user's quotas as they stand (None: no such user)."""
        async with transaction(self.sessions) as session:
            return await self._state(session, user_id, now or self.clock())

    async def _state(
        self, session: AsyncSession, user_id: UUID, now: datetime
    ) -> QuotaStatus | None:
        today = now.date()
        row = await counter.read_usage(session, user_id, today, today.replace(day=1))
        if row is None:
            return None
        return QuotaStatus(
            self.defaults.apply(row.per_day, row.per_month),
            row.used_day,
            row.used_month,
            _start_of_next_day(today),
            _start_of_next_month(today),
        )

    async def check(
        self, session: AsyncSession, user_id: UUID, overrides: Overrides | None = None
    ) -> Admission:
        """The one read before a reply starts: raises QuotaExceededError once the user's day or
        month is used up. Given the user's `overrides` (read with the caller's own query), no
        read at all when neither they nor the defaults set a limit: there is nothing to check
        or reserve (the reply's use is still counted at its end)."""
        now = self.clock()
        if overrides is not None and not self.defaults.apply(*overrides).any:
            return Admission(user_id, now, None)
        state = await self._state(session, user_id, now)
        if state is not None:
            _refuse_if_used_up(state, now)
        return Admission(user_id, now, state)

    async def take(self, session: AsyncSession, admission: Admission, tokens: int) -> Reservation:
        """Reserve `tokens` in `session`'s transaction (its first write: see counter.reserve), or
        raise QuotaExceededError when concurrent replies took what was left. Writes nothing for
        a user with no limit (their reply is counted when it ends)."""
        state, now = admission.state, admission.now
        today = now.date()
        if state is None or not state.limits.any:
            return Reservation(admission.user_id, today, 0)
        taken = await counter.reserve(
            session,
            admission.user_id,
            today,
            today.replace(day=1),
            tokens,
            per_day=state.limits.per_day,
            per_month=state.limits.per_month,
        )
        if not taken:
            latest = await self._state(session, admission.user_id, now)
            _refuse_if_used_up(latest or state, now, always=True)
        return Reservation(admission.user_id, today, tokens)

    async def reserve(self, user_id: UUID, tokens: int) -> Reservation:
        """`check` and `take`, each in a transaction of its own."""
        async with transaction(self.sessions) as session:
            admission = await self.check(session, user_id)
        async with transaction(self.sessions) as session:
            return await self.take(session, admission, tokens)

    async def admit(
        self,
        user_id: UUID,
        tokens: int,
        persist: Persist,
        session: AsyncSession | None = None,
        overrides: Overrides | None = None,
    ) -> Admitted:
        """A reply about to start (ReplyService._launch): refused now if the quota is used up.
        With the caller's `session` (a send's: its transaction writes the turn), the reservation
        is taken in it, just before the turn's rows (`Admitted.persist`), so that it commits with
        them or is rolled back with them, and no second connection is held; `overrides`: the
        user's, as that transaction read them (see `check`). Without, it is taken now in a
        transaction of its own (`Admitted.release` gives it back if the start fails)."""
        if session is None:
            return Admitted(self, persist, await self.reserve(user_id, tokens))
        admitted = Admitted(self, persist, None, own_transaction=False)
        admission = await self.check(session, user_id, overrides)

        async def reserve_then_persist(request_id: str) -> ReplyRows:
            admitted.reservation = await self.take(session, admission, tokens)
            return await persist(request_id)

        admitted.persist = reserve_then_persist
        return admitted

    async def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose reply never started."""
        if reservation.tokens:
            async with transaction(self.sessions) as session:
                await counter.add(session, [_params(reservation, -reservation.tokens)])

    def hold(self, message_id: str, reservation: Reservation) -> None:
        """The reply `message_id` started: its reservation is settled with its final save."""
        self._held[message_id] = reservation

    def settlements(self, outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
        """The counter changes that these replies' ends make: each reply's engine usage in place
        of its reservation (for `counter.add`, in the transaction that saves the ends)."""
        params = []
        for outcome in outcomes:
            reservation = self._held.get(outcome.message_id)
            if reservation is None:  # not started through a ReplyService (tests), or settled
                continue
            used = outcome.prompt_tokens + outcome.completion_tokens
            if used != reservation.tokens:
                params.append(_params(reservation, used - reservation.tokens))
        return params

    def settled(self, outcomes: Sequence[Outcome]) -> None:
        """Those ends are saved, their settlements with them."""
        for outcome in outcomes:
            self._held.pop(outcome.message_id, None)


def _refuse_if_used_up(state: QuotaStatus, now: datetime, *, always: bool = False) -> None:
    """Raise QuotaExceededError for the period used up (`always`: for one, the day's unless
    only the month has a limit)."""
    limits = state.limits
    if limits.per_month > 0 and state.used_month >= limits.per_month:
        raise QuotaExceededError("month", limits.per_month, state.month_resets_at, now)
    if limits.per_day > 0 and (always or state.used_day >= limits.per_day):
        raise QuotaExceededError("day", limits.per_day, state.day_resets_at, now)
    if always:
        raise QuotaExceededError("month", limits.per_month, state.month_resets_at, now)


def _params(reservation: Reservation, delta: int) -> dict[str, Any]:
    return {"user": reservation.user_id, "day": reservation.day, "delta": delta}
