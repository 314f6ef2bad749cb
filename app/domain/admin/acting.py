"""What every admin action needs from its request: who acts, from where, and telling this
process's access cache that an account changed (the other replicas re-read it within a second:
app/domain/accounts/access.py)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar.connection import ASGIConnection

from app.db.session import Sessions
from app.domain.accounts import audit
from app.domain.accounts import service as accounts
from app.domain.accounts.access import AccessCache
from app.domain.accounts.audit import Actor
from app.domain.accounts.authentication import ACCESS_STATE_KEY
from app.domain.accounts.login import client_address
from app.domain.accounts.models import User


def actor(connection: ASGIConnection[Any, Any, Any, Any], admin: User) -> Actor:
    return Actor(admin.id, admin.email, client_address(connection))


async def acting_admin(connection: ASGIConnection[Any, Any, Any, Any], sessions: Sessions) -> Actor:
    """The admin making this request, for routes that do not load their row otherwise."""
    admin = await accounts.get_user(sessions, connection.user)
    email = admin.email if admin is not None else str(connection.user)
    return Actor(connection.user, email, client_address(connection))


def changed(connection: ASGIConnection[Any, Any, Any, Any], user_id: UUID) -> None:
    cache: AccessCache = connection.app.state[ACCESS_STATE_KEY]
    cache.forget(user_id)


async def record_look(
    connection: ASGIConnection[Any, Any, Any, Any],
    sessions: Sessions,
    action: str,
    owner_id: UUID,
    conversation_id: UUID,
) -> None:
    """Audit an admin opening or exporting a conversation, unless it is their own."""
    if owner_id == connection.user:
        return
    admin = await accounts.get_user(sessions, connection.user)
    owner = await accounts.get_user(sessions, owner_id)
    if admin is not None:
        await audit.record_now(
            sessions, actor(connection, admin), action, owner, conversation=conversation_id
        )
