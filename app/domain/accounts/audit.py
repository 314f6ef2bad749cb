"""The audit log: who did what to whom, when, and from where. Append-only: this module only
inserts and reads; no route updates or deletes an entry, and deleting a user keeps the entries
that name them (plain id columns, no foreign key: app/domain/accounts/models.py).

An action and its entry share one transaction (`record` takes the caller's session), so a change
is never made without its entry, nor an entry written for a change that was refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.session import Sessions, transaction
from app.domain.accounts.models import AuditEntry, User

ACTIONS = (
    "approve",
    "disable",
    "enable",
    "role",
    "delete",
    "create",
    "reset_link",
    "logout_everywhere",
    "invite",
    "view_conversation",
    "export_conversation",
    "kill_reply",
    "quota",
)


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: an admin's id and email (None and "cli" from the command line), and their
    address (the client's, after a trusted proxy: app/domain/accounts/login.py)."""

    id: UUID | None
    email: str
    address: str = ""


CLI = Actor(None, "cli", "local")


async def record(
    session: AsyncSession,
    actor: Actor,
    action: str,
    target: User | None = None,
    **detail: Any,
) -> None:
    session.add(
        AuditEntry(
            actor_id=actor.id,
            actor_email=actor.email,
            action=action,
            target_id=target.id if target is not None else None,
            target_email=target.email if target is not None else None,
            detail=json.dumps(detail, sort_keys=True, default=str) if detail else "",
            address=actor.address[:64],
        )
    )


async def record_now(
    sessions: Sessions, actor: Actor, action: str, target: User | None = None, **detail: Any
) -> None:
    """`record` in a transaction of its own (for actions that change nothing: a view)."""
    async with transaction(sessions) as session:
        await record(session, actor, action, target, **detail)


@dataclass(frozen=True, slots=True)
class AuditFilter:
    action: str | None = None
    user: str | None = None  # part of the actor's or the target's email, or an exact id
    since: datetime | None = None
    before: datetime | None = None


async def list_entries(
    sessions: Sessions, filters: AuditFilter, *, limit: int, offset: int = 0
) -> tuple[list[AuditEntry], int]:
    """One page of entries, newest first, and how many match in all."""
    query = select(AuditEntry)
    if filters.action:
        query = query.where(AuditEntry.action == filters.action)
    if filters.user:
        needle = f"%{filters.user.lower()}%"
        matches = [
            func.lower(AuditEntry.actor_email).like(needle),
            func.lower(AuditEntry.target_email).like(needle),
        ]
        try:
            wanted = UUID(filters.user)
            matches += [AuditEntry.actor_id == wanted, AuditEntry.target_id == wanted]
        except ValueError:
            pass
        query = query.where(or_(*matches))
    if filters.since:
        query = query.where(AuditEntry.created_at >= filters.since)
    if filters.before:
        query = query.where(AuditEntry.created_at < filters.before)
    async with transaction(sessions) as session:
        total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
        rows = await session.scalars(
            query.order_by(AuditEntry.created_at.desc(), AuditEntry.id).limit(limit).offset(offset)
        )
        return list(rows), total
