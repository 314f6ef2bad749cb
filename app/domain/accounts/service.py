"""Accounts: creating users, logging in, admins, API keys.

Every function takes the app's `async_sessionmaker` and runs one short transaction. Emails are
compared and stored lower-cased (a unique index on `lower(email)` backs this up).
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from sqlalchemy import ColumnElement, exists, func, select, update
from sqlalchemy.exc import IntegrityError

from app.db.base import utcnow
from app.db.session import Sessions, transaction
from app.domain.accounts import links, passwords
from app.domain.accounts.api_keys import generate_api_key, hash_api_key, looks_like_api_key
from app.domain.accounts.models import ApiKey, User, UserState
from app.domain.errors import DomainError

LAST_USED_RESOLUTION = timedelta(minutes=1)
"""`last_used_at` is refreshed at most this often: a busy key must not cost a write per request."""


class EmailTakenError(DomainError, ValueError):
    """A user with this email (in any letter case) already exists."""

    status = 409
    message = "an account with this email already exists"


class InvalidEmailError(DomainError, ValueError):
    """Not an email address."""


class SignupClosedError(DomainError, PermissionError):
    status = 403
    message = "sign-up is closed: ask an admin for an account"


def normalize_email(email: str) -> str:
    return email.strip().lower()


def _by_email(email: str) -> ColumnElement[bool]:
    return func.lower(User.email) == normalize_email(email)


async def create_user(
    sessions: Sessions,
    email: str,
    password: str,
    *,
    is_admin: bool | None = None,
    state: UserState = UserState.ACTIVE,
    invite: str | None = None,
    only_first: bool = False,
) -> User:
    """Create a user; with `is_admin=None` the first user of the instance becomes its admin
    (active, whatever `state` says: an instance needs an admin who can approve the others).

    Anyone else is created in `state`; with `invite`, only by spending that invitation in the same
    transaction (app/domain/accounts/links.py); with `only_first`, not at all (SIGNUP_MODE=closed).
    Raises `EmailTakenError`, `InvalidEmailError`, `passwords.WeakPasswordError`,
    `SignupClosedError` and `links.InvalidLinkError`. Sign-ups racing on an empty instance all
    try to be the first admin, and the unique index on `first_admin` lets exactly one of them.
    """
    email = normalize_email(email)
    if "@" not in email:
        raise InvalidEmailError("an email address needs an @")
    passwords.check_password_strength(password)
    password_hash = await passwords.hash_password(password)
    if is_admin is None and not await any_user(sessions):
        try:
            return await _insert_user(
                sessions,
                User(email=email, password_hash=password_hash, is_admin=True, first_admin=True),
            )
        except IntegrityError:
            pass  # another sign-up was first (or the email is taken: the insert below says so)
    if only_first:
        raise SignupClosedError()
    user = User(email=email, password_hash=password_hash, is_admin=bool(is_admin), state=state)
    return await _insert_user(sessions, user, invite=invite)


async def any_user(sessions: Sessions) -> bool:
    async with transaction(sessions) as session:
        return bool(await session.scalar(select(exists().select_from(User))))


async def _insert_user(sessions: Sessions, user: User, *, invite: str | None = None) -> User:
    try:
        async with transaction(sessions) as session:
            if invite is not None and not await links.use_invite(session, invite, user.email):
                raise links.InvalidLinkError()
            session.add(user)
    except IntegrityError as exc:
        if user.first_admin:
            raise
        raise EmailTakenError(user.email) from exc
    return user


async def get_user(sessions: Sessions, user_id: UUID) -> User | None:
    async with transaction(sessions) as session:
        return await session.get(User, user_id)


async def get_user_by_email(sessions: Sessions, email: str) -> User | None:
    async with transaction(sessions) as session:
        return await session.scalar(select(User).where(_by_email(email)))


async def list_users(sessions: Sessions) -> list[User]:
    async with transaction(sessions) as session:
        return list(await session.scalars(select(User).order_by(User.created_at)))


async def authenticate(sessions: Sessions, email: str, password: str) -> User | None:
    """The user whose credentials these are, or None; upgrades an outdated hash on the way."""
    user = await get_user_by_email(sessions, email)
    if user is None:
        await passwords.burn_verification_time(password)
        return None
    if not await passwords.verify_password(user.password_hash, password):
        return None
    if passwords.needs_rehash(user.password_hash):
        user.password_hash = await passwords.hash_password(password)
        async with transaction(sessions) as session:
            await session.execute(
                update(User).where(User.id == user.id).values(password_hash=user.password_hash)
            )
    return user


async def set_password(sessions: Sessions, user_id: UUID, password: str) -> bool:
    passwords.check_password_strength(password)
    password_hash = await passwords.hash_password(password)
    async with transaction(sessions) as session:
        result = await session.execute(
            update(User).where(User.id == user_id).values(password_hash=password_hash)
        )
        return result.rowcount > 0


async def set_admin(sessions: Sessions, user_id: UUID, is_admin: bool = True) -> bool:
    async with transaction(sessions) as session:
        result = await session.execute(
            update(User).where(User.id == user_id).values(is_admin=is_admin)
        )
        return result.rowcount > 0


async def promote_admin(sessions: Sessions, email: str) -> User | None:
    """Make the user with this email an admin; None when there is no such user."""
    async with transaction(sessions) as session:
        user = await session.scalar(select(User).where(_by_email(email)))
        if user is not None:
            user.is_admin = True
        return user


async def create_or_promote_admin(
    sessions: Sessions, email: str, password: str | None
) -> tuple[User, bool]:
    """For the CLI: make `email` an admin, creating the user if needed. Returns (user, created).

    An existing user keeps their password unless a new one is given. Creating needs a password.
    """
    user = await promote_admin(sessions, email)
    if user is None:
        if password is None:
            raise ValueError("a new user needs a password")
        return await create_user(sessions, email, password, is_admin=True), True
    if password is not None:
        await set_password(sessions, user.id, password)
    return user, False


async def create_api_key(sessions: Sessions, user_id: UUID, name: str) -> tuple[ApiKey, str]:
    """A new key for `user_id`: the stored row and the secret, which is never available again."""
    new = generate_api_key()
    async with transaction(sessions) as session:
        key = ApiKey(
            user_id=user_id,
            name=name.strip()[:100] or "API key",
            prefix=new.prefix,
            key_hash=new.key_hash,
        )
        session.add(key)
    return key, new.secret


async def list_api_keys(
    sessions: Sessions, user_id: UUID, *, include_revoked: bool = False
) -> list[ApiKey]:
    query = select(ApiKey).where(ApiKey.user_id == user_id)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    async with transaction(sessions) as session:
        return list(await session.scalars(query.order_by(ApiKey.created_at.desc())))


async def revoke_api_key(sessions: Sessions, user_id: UUID, key_id: UUID) -> bool:
    """Revoke one of `user_id`'s keys; False when it is not theirs or already revoked."""
    async with transaction(sessions) as session:
        result = await session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id, ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
        return result.rowcount > 0


async def verify_api_key(sessions: Sessions, secret: str) -> User | None:
    """The owner of an active key with this secret, or None."""
    if not looks_like_api_key(secret):
        return None
    key_hash = hash_api_key(secret)
    now = utcnow()
    async with transaction(sessions) as session:
        row = (
            await session.execute(
                select(ApiKey, User)
                .join(User, User.id == ApiKey.user_id)
                .where(
                    ApiKey.key_hash == key_hash,
                    ApiKey.revoked_at.is_(None),
                    User.state == UserState.ACTIVE,  # a pending or disabled account's keys fail
                )
            )
        ).one_or_none()
        if row is None:
            return None
        key, user = row
        if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
            key.last_used_at = now
        return user
