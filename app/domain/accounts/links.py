"""One-time account links: invitations (SIGNUP_MODE=invite) and password resets.

An admin makes a link and hands it over (there is no mail). The secret is in the link only; the
database keeps its SHA-256, as for API keys (app/domain/accounts/api_keys.py). Using a link is one
conditional UPDATE ("... WHERE not used and not expired"), so two uses at once cannot both win.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from uuid import UUID

from sqlalchemy import or_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts import audit, passwords
from app.domain.accounts.audit import Actor
from app.domain.accounts.management import UserNotFoundError, next_epoch, revoke_keys
from app.domain.accounts.models import AccountToken, TokenKind, User
from app.domain.errors import DomainError

INVITE_TTL = timedelta(days=7)
RESET_TTL = timedelta(hours=24)
_RANDOM_BYTES = 32


class InvalidLinkError(DomainError, ValueError):
    status = 400
    message = "this link is not valid: it was used already, it expired, or it is for another email"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _looks_like_secret(secret: str) -> bool:
    return 0 < len(secret) <= 100


async def create_invite(
    sessions: Sessions, actor: Actor, email: str | None = None, ttl: timedelta = INVITE_TTL
) -> tuple[AccountToken, str]:
    """An invitation (for `email` only, when given): the row and its secret, shown once."""
    secret = secrets.token_urlsafe(_RANDOM_BYTES)
    email = email.strip().lower() if email and email.strip() else None
    async with transaction(sessions) as session:
        token = AccountToken(
            kind=TokenKind.INVITE,
            token_hash=_hash(secret),
            email=email,
            created_by=actor.id,
            expires_at=utcnow() + ttl,
        )
        session.add(token)
        await audit.record(session, actor, "invite", email=email, expires_at=token.expires_at)
    return token, secret


async def use_invite(session: AsyncSession, secret: str, email: str) -> bool:
    """Spend an invitation for a sign-up as `email`, in the sign-up's own transaction (a sign-up
    that fails, a taken email, leaves the invitation unused)."""
    if not _looks_like_secret(secret):
        return False
    now = utcnow()
    result = await session.execute(
        update(AccountToken)
        .where(
            AccountToken.token_hash == _hash(secret),
            AccountToken.kind == TokenKind.INVITE,
            AccountToken.used_at.is_(None),
            AccountToken.expires_at > now,
            or_(AccountToken.email.is_(None), AccountToken.email == email),
        )
        .values(used_at=now)
    )
    return result.rowcount > 0


async def create_reset_link(
    sessions: Sessions, actor: Actor, user_id: UUID, ttl: timedelta = RESET_TTL
) -> tuple[User, str]:
    """A password-reset link for `user_id`; an older unused one stops working."""
    secret = secrets.token_urlsafe(_RANDOM_BYTES)
    now = utcnow()
    async with transaction(sessions) as session:
        user = await session.get(User, user_id)
        if user is None:
            raise UserNotFoundError()
        await session.execute(
            update(AccountToken)
            .where(
                AccountToken.user_id == user_id,
                AccountToken.kind == TokenKind.RESET,
                AccountToken.used_at.is_(None),
            )
            .values(used_at=now)
        )
        session.add(
            AccountToken(
                kind=TokenKind.RESET,
                token_hash=_hash(secret),
                user_id=user_id,
                created_by=actor.id,
                expires_at=now + ttl,
            )
        )
        await audit.record(session, actor, "reset_link", user, expires_at=now + ttl)
    return user, secret


async def reset_password(sessions: Sessions, secret: str, password: str) -> User:
    """Set the password a reset link is for, once. Every session of the user ends and their
    API keys are revoked: whoever knew the old password keeps nothing."""
    passwords.check_password_strength(password)
    if not _looks_like_secret(secret):
        raise InvalidLinkError()
    password_hash = await passwords.hash_password(password)
    now = utcnow()
    async with transaction(sessions) as session:
        user_id = await session.scalar(
            update(AccountToken)
            .where(
                AccountToken.token_hash == _hash(secret),
                AccountToken.kind == TokenKind.RESET,
                AccountToken.used_at.is_(None),
                AccountToken.expires_at > now,
            )
            .values(used_at=now)
            .returning(AccountToken.user_id)
        )
        if user_id is None:
            raise InvalidLinkError()
        user = await session.scalar(
            update(User)
            .where(User.id == user_id)
            .values(password_hash=password_hash, session_epoch=next_epoch())
            .returning(User)
        )
        if user is None:
            raise InvalidLinkError()
        await revoke_keys(session, user_id)
        return user
