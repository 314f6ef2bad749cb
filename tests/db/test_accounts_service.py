"""Accounts on real SQLite and PostgreSQL: users, passwords, admins and API keys."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from argon2 import PasswordHasher
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts import passwords
from app.domain.accounts import service as accounts
from app.domain.accounts.api_keys import KEY_PREFIX, generate_api_key
from app.domain.accounts.models import ApiKey, User

Sessions = async_sessionmaker[AsyncSession]
MakeUser = Callable[..., Awaitable[User]]
PASSWORD = "correct horse battery staple"


async def _stored_user(sessions: Sessions, email: str) -> User:
    async with sessions() as session:
        user = await session.scalar(select(User).where(User.email == email))
        assert user is not None
        return user


async def test_password_hashing_with_the_real_parameters() -> None:
    password_hash = await passwords.hash_password(PASSWORD)
    assert password_hash.startswith("$argon2id$") and PASSWORD not in password_hash
    assert await passwords.verify_password(password_hash, PASSWORD)
    assert not await passwords.verify_password(password_hash, PASSWORD + "!")
    assert not await passwords.verify_password("not a hash", PASSWORD)
    assert not passwords.needs_rehash(password_hash)
    assert await passwords.hash_password(PASSWORD) != password_hash  # salted


async def test_users_store_only_a_hash(db_sessions: Sessions) -> None:
    user = await accounts.create_user(db_sessions, "Alice@Example.com ", PASSWORD)
    stored = await _stored_user(db_sessions, "alice@example.com")
    assert stored.id == user.id
    assert stored.password_hash.startswith("$argon2id$")
    assert PASSWORD not in stored.password_hash
    assert await accounts.authenticate(db_sessions, "alice@example.com", PASSWORD) is not None


async def test_first_user_becomes_admin(db_sessions: Sessions, fast_password_hashing: None) -> None:
    first = await accounts.create_user(db_sessions, "first@example.com", PASSWORD)
    second = await accounts.create_user(db_sessions, "second@example.com", PASSWORD)
    chosen = await accounts.create_user(db_sessions, "third@example.com", PASSWORD, is_admin=True)
    assert (first.is_admin, second.is_admin, chosen.is_admin) == (True, False, True)
    assert [u.email for u in await accounts.list_users(db_sessions)] == [
        "first@example.com",
        "second@example.com",
        "third@example.com",
    ]


CONCURRENT_SIGN_UPS = 8
ROUNDS = 5


async def test_concurrent_first_sign_ups_make_exactly_one_admin(
    db_sessions: Sessions, fast_password_hashing: None
) -> None:
    """Sign-ups racing on an empty instance: exactly one becomes admin, every one is created.
    (Before the `first_admin` unique index: 5 of 8 admins on SQLite, 8 of 8 on PostgreSQL.)"""
    for round_ in range(ROUNDS):
        emails = [f"racer{i}-{round_}@example.com" for i in range(CONCURRENT_SIGN_UPS)]
        users = await asyncio.gather(
            *(accounts.create_user(db_sessions, email, PASSWORD) for email in emails)
        )
        admins = [u.email for u in users if u.is_admin]
        stored = await accounts.list_users(db_sessions)
        assert sorted(u.email for u in stored) == sorted(emails)
        assert len(admins) == 1, f"round {round_}: {len(admins)} first admins: {admins}"
        assert [u.email for u in stored if u.is_admin] == admins
        async with db_sessions() as session, session.begin():
            await session.execute(delete(User))  # empty again for the next round


async def test_the_database_admits_one_first_admin(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    """The unique index itself, for writes that bypass the service."""
    first = await accounts.create_user(db_sessions, "first@example.com", PASSWORD)
    assert first.is_admin and first.first_admin is True
    later = await make_user("later@example.com", is_admin=True)  # an admin made by the CLI
    assert later.first_admin is None
    with pytest.raises(IntegrityError):
        async with db_sessions() as session, session.begin():
            session.add(User(email="x@example.com", password_hash="x", first_admin=True))


async def test_emails_are_unique_whatever_the_case(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    user = await make_user("Bob@Example.com")
    assert user.email == "bob@example.com"
    with pytest.raises(accounts.EmailTakenError):
        await make_user("  BOB@example.COM")
    found = await accounts.get_user_by_email(db_sessions, "BoB@eXample.com")
    assert found is not None and found.id == user.id

    # The database enforces it too, for writes that bypass the service.
    with pytest.raises(IntegrityError):
        async with db_sessions() as session, session.begin():
            session.add(User(email="BOB@EXAMPLE.COM", password_hash="x", is_admin=False))


async def test_create_user_rejects_bad_input(
    db_sessions: Sessions, fast_password_hashing: None
) -> None:
    with pytest.raises(passwords.WeakPasswordError):
        await accounts.create_user(db_sessions, "a@example.com", "short")
    with pytest.raises(ValueError, match="@"):
        await accounts.create_user(db_sessions, "not-an-email", PASSWORD)
    assert await accounts.list_users(db_sessions) == []


async def test_authenticate(db_sessions: Sessions, make_user: MakeUser) -> None:
    user = await make_user("carol@example.com", password=PASSWORD)
    authenticated = await accounts.authenticate(db_sessions, " CAROL@example.com", PASSWORD)
    assert authenticated is not None and authenticated.id == user.id
    assert await accounts.authenticate(db_sessions, "carol@example.com", "wrong password") is None
    assert await accounts.authenticate(db_sessions, "nobody@example.com", PASSWORD) is None


async def test_authenticate_upgrades_an_outdated_hash(
    db_sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(passwords, "hasher", PasswordHasher(time_cost=1, memory_cost=256))
    await accounts.create_user(db_sessions, "dave@example.com", PASSWORD)
    old_hash = (await _stored_user(db_sessions, "dave@example.com")).password_hash

    monkeypatch.setattr(passwords, "hasher", PasswordHasher(time_cost=2, memory_cost=512))
    assert passwords.needs_rehash(old_hash)
    assert await accounts.authenticate(db_sessions, "dave@example.com", PASSWORD) is not None
    new_hash = (await _stored_user(db_sessions, "dave@example.com")).password_hash
    assert new_hash != old_hash and not passwords.needs_rehash(new_hash)
    assert await accounts.authenticate(db_sessions, "dave@example.com", PASSWORD) is not None


async def test_set_password(db_sessions: Sessions, make_user: MakeUser) -> None:
    user = await make_user("erin@example.com")
    assert await accounts.set_password(db_sessions, user.id, "a new passphrase")
    assert await accounts.authenticate(db_sessions, "erin@example.com", PASSWORD) is None
    assert await accounts.authenticate(db_sessions, "erin@example.com", "a new passphrase")


async def test_promote_and_create_admin(db_sessions: Sessions, make_user: MakeUser) -> None:
    await make_user("someone@example.com")  # not the first user: no implicit admin below
    user = await make_user("frank@example.com")
    assert not user.is_admin
    promoted = await accounts.promote_admin(db_sessions, "FRANK@example.com")
    assert promoted is not None and promoted.is_admin
    assert (await _stored_user(db_sessions, "frank@example.com")).is_admin
    assert await accounts.promote_admin(db_sessions, "ghost@example.com") is None

    created, was_created = await accounts.create_or_promote_admin(
        db_sessions, "grace@example.com", PASSWORD
    )
    assert was_created and created.is_admin
    again, was_created = await accounts.create_or_promote_admin(
        db_sessions, "grace@example.com", None
    )
    assert not was_created and again.id == created.id
    with pytest.raises(ValueError, match="password"):
        await accounts.create_or_promote_admin(db_sessions, "new@example.com", None)

    assert await accounts.set_admin(db_sessions, created.id, False)
    assert not (await _stored_user(db_sessions, "grace@example.com")).is_admin


def test_generated_api_keys() -> None:
    new = generate_api_key()
    assert new.secret.startswith(KEY_PREFIX) and len(new.secret) > 40
    assert new.secret.startswith(new.prefix) and len(new.prefix) < 16
    assert new.key_hash == hashlib.sha256(new.secret.encode()).hexdigest()
    assert generate_api_key().secret != new.secret


async def test_api_keys_are_stored_hashed(db_sessions: Sessions, make_user: MakeUser) -> None:
    user = await make_user()
    key, secret = await accounts.create_api_key(db_sessions, user.id, "laptop")
    assert secret.startswith("sk-sc-") and key.prefix == secret[: len(key.prefix)]
    async with db_sessions() as session:
        rows = (await session.execute(select(ApiKey.__table__))).all()
    assert len(rows) == 1
    assert all(secret not in str(value) for value in rows[0])
    assert rows[0].key_hash == hashlib.sha256(secret.encode()).hexdigest()


async def test_verify_and_revoke_api_keys(db_sessions: Sessions, make_user: MakeUser) -> None:
    owner = await make_user()
    other = await make_user()
    key, secret = await accounts.create_api_key(db_sessions, owner.id, "ci")
    spare, spare_secret = await accounts.create_api_key(db_sessions, owner.id, "spare")

    verified = await accounts.verify_api_key(db_sessions, secret)
    assert verified is not None and verified.id == owner.id
    [listed] = [k for k in await accounts.list_api_keys(db_sessions, owner.id) if k.id == key.id]
    assert listed.last_used_at is not None and listed.name == "ci"

    assert await accounts.verify_api_key(db_sessions, secret + "x") is None
    assert await accounts.verify_api_key(db_sessions, "sk-sc-") is None
    assert await accounts.verify_api_key(db_sessions, "Bearer nonsense") is None

    assert not await accounts.revoke_api_key(db_sessions, other.id, key.id)  # not theirs
    assert await accounts.revoke_api_key(db_sessions, owner.id, key.id)
    assert not await accounts.revoke_api_key(db_sessions, owner.id, key.id)  # already revoked
    assert await accounts.verify_api_key(db_sessions, secret) is None
    assert await accounts.verify_api_key(db_sessions, spare_secret) is not None

    assert [k.id for k in await accounts.list_api_keys(db_sessions, owner.id)] == [spare.id]
    everything = await accounts.list_api_keys(db_sessions, owner.id, include_revoked=True)
    assert {k.id for k in everything} == {key.id, spare.id}
    assert await accounts.list_api_keys(db_sessions, other.id) == []


async def test_last_used_is_refreshed_at_most_once_a_minute(
    db_sessions: Sessions, make_user: MakeUser
) -> None:
    user = await make_user()
    key, secret = await accounts.create_api_key(db_sessions, user.id, "busy")
    await accounts.verify_api_key(db_sessions, secret)
    [first] = await accounts.list_api_keys(db_sessions, user.id)
    await accounts.verify_api_key(db_sessions, secret)
    [second] = await accounts.list_api_keys(db_sessions, user.id)
    assert second.last_used_at == first.last_used_at

    assert first.last_used_at is not None
    stale = first.last_used_at - timedelta(minutes=2)
    async with db_sessions() as session, session.begin():
        await session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=stale))
    await accounts.verify_api_key(db_sessions, secret)
    [third] = await accounts.list_api_keys(db_sessions, user.id)
    assert third.last_used_at is not None and third.last_used_at > stale
