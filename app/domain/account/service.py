"""What a user does to their own account. Each change that needs the password checks it first
(argon2, off the event loop); the changes themselves are single transactions in the accounts
domain (browser_sessions.py, management.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import select

from app.db.session import Sessions, transaction
from app.domain.accounts import browser_sessions, management, passwords
from app.domain.accounts.audit import Actor
from app.domain.accounts.models import AuditEntry, User
from app.domain.chat.models import Conversation
from app.domain.errors import DomainError

LOOK_ACTIONS = ("view_conversation", "export_conversation")
MAX_LOOKS = 200


class WrongPasswordError(DomainError, PermissionError):
    status = 403
    message = "the password is wrong"


async def check_password(user: User, password: str) -> None:
    """WrongPasswordError unless `password` is the user's."""
    if not await passwords.verify_password(user.password_hash, password):
        raise WrongPasswordError()


async def change_password(
    sessions: Sessions, user: User, current: str, new: str, keep: UUID | None
) -> int:
    """Set a new password (the current one required); every other session of the user's ends.
    Returns the account's new epoch, for the kept session (`keep`) to take."""
    await check_password(user, current)
    epoch = await browser_sessions.end_others(sessions, user.id, keep, new_password=new)
    if epoch is None:
        raise management.UserNotFoundError()
    return epoch


async def delete_account(sessions: Sessions, user: User, password: str, address: str) -> None:
    """Delete the account and everything of theirs (management.delete_user: conversations, ratings,
    keys, links and sessions go; the audit log keeps its entries, naming them by id). The last
    active admin cannot (LastAdminError)."""
    await check_password(user, password)
    await management.delete_user(sessions, Actor(user.id, user.email, address), user.id)


@dataclass(frozen=True, slots=True)
class Look:
    """An admin opened or exported one of the user's conversations."""

    at: datetime
    action: str
    admin_id: UUID | None
    admin_email: str
    conversation_id: UUID | None
    conversation_title: str | None  # None: the conversation is gone since


def _conversation_of(entry: AuditEntry) -> UUID | None:
    try:
        return UUID(json.loads(entry.detail or "{}").get("conversation", ""))
    except (ValueError, AttributeError, TypeError):
        return None


async def looks_at(sessions: Sessions, user_id: UUID, limit: int = MAX_LOOKS) -> list[Look]:
    """The admins' looks at the user's conversations, newest first (from the audit log)."""
    async with transaction(sessions) as session:
        entries = list(
            await session.scalars(
                select(AuditEntry)
                .where(AuditEntry.target_id == user_id, AuditEntry.action.in_(LOOK_ACTIONS))
                .order_by(AuditEntry.created_at.desc(), AuditEntry.id)
                .limit(limit)
            )
        )
        ids = {c for e in entries if (c := _conversation_of(e)) is not None}
        titles: dict[UUID, str] = {}
        if ids:
            rows = await session.execute(
                select(Conversation.id, Conversation.title).where(
                    Conversation.id.in_(ids), Conversation.user_id == user_id
                )
            )
            titles = {conversation_id: title for conversation_id, title in rows}
    return [
        Look(
            at=e.created_at,
            action=e.action,
            admin_id=e.actor_id,
            admin_email=e.actor_email,
            conversation_id=(c := _conversation_of(e)),
            conversation_title=titles.get(c) if c is not None else None,
        )
        for e in entries
    ]
