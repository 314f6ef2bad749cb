"""An admin sets one user's token quotas: the change and its audit entry in one transaction.

A limit is None (follow QUOTA_TOKENS_PER_DAY / _MONTH), 0 (no limit) or a number of tokens. It
takes effect at once everywhere: every reply's start reads the user's row (no cache).
"""

from __future__ import annotations

from uuid import UUID

from app.db.session import Sessions, transaction
from app.domain.accounts import audit
from app.domain.accounts.audit import Actor
from app.domain.accounts.management import UserNotFoundError
from app.domain.accounts.models import User
from app.domain.errors import InvalidInputError

MAX_LIMIT = 2_000_000_000  # the columns are 32-bit integers


def check_limit(value: int | None, field: str) -> int | None:
    if value is not None and not 0 <= value <= MAX_LIMIT:
        raise InvalidInputError(
            f"{field} must be empty (the default), 0 (no limit) or up to {MAX_LIMIT:,} tokens",
            field=field,
        )
    return value


async def set_limits(
    sessions: Sessions, actor: Actor, user_id: UUID, per_day: int | None, per_month: int | None
) -> User:
    """Set the user's overrides; audited as `quota` with the limits before and after."""
    check_limit(per_day, "per_day")
    check_limit(per_month, "per_month")
    async with transaction(sessions) as session:
        user = await session.get(User, user_id, with_for_update=True)
        if user is None:
            raise UserNotFoundError()
        before = {"per_day": user.quota_tokens_per_day, "per_month": user.quota_tokens_per_month}
        user.quota_tokens_per_day, user.quota_tokens_per_month = per_day, per_month
        after = {"per_day": per_day, "per_month": per_month}
        await audit.record(session, actor, "quota", user, before=before, after=after)
    return user


def parse_form_limit(text: str, field: str) -> int | None:
    """A users-page box: empty is the default, else a whole number of tokens."""
    text = text.strip().replace(",", "").replace("_", "")
    if not text:
        return None
    if not text.isdigit():
        raise InvalidInputError(f"{field}: a whole number of tokens, or empty for the default")
    return check_limit(int(text), field)
