"""Shared fixtures: real databases, migrated by the real migrations.

Database tests run twice, on a SQLite file and on PostgreSQL, through the `database_backend`
parameter. Fixtures, from raw to ready:

- `database_url`: an empty database (a fresh SQLite file; for PostgreSQL, a clean `public` schema
  in a throwaway database created for this test session with a random name and dropped at its end).
  The migration tests start here and run the real migrations themselves.
- `migrated_database_url`: a database at `alembic upgrade head`, from a database the migrations
  built once per test session (per xdist worker): on SQLite a copy of that file, on PostgreSQL
  that database with its tables emptied. (Upgrading every test's database cost 0.1-0.5 s.)
- `db_engine`, `db_sessions`: an engine and an `async_sessionmaker` on the migrated database.
- `make_user`: creates users cheaply (see `fast_password_hashing`).

PostgreSQL is found at TEST_POSTGRES_URL (default: postgres@127.0.0.1:5432, trust auth). It is
required, not optional: without it the PostgreSQL half of the tests errors instead of skipping.
A test module that only wants SQLite can override `database_backend` with a plain fixture
returning "sqlite".
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import asyncpg
import pytest
from argon2 import PasswordHasher
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.engine import create_engine, make_sessionmaker
from app.db.migrate import VERSION_TABLE, upgrade_database
from app.domain.accounts import passwords
from app.domain.accounts.models import User

TEST_POSTGRES_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TEST_PASSWORD = "correct horse battery staple"


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _postgres_url(name: str) -> str:
    return (
        make_url(TEST_POSTGRES_URL)
        .set(drivername="postgresql+asyncpg", database=name)
        .render_as_string(hide_password=False)
    )


async def _admin_execute(sql: str) -> None:
    connection = await asyncpg.connect(_asyncpg_dsn(TEST_POSTGRES_URL))
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@contextmanager
def _throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL database with a random name (asyncpg URL); dropped afterwards."""
    name = f"streamchat_test_{secrets.token_hex(6)}"
    asyncio.run(_admin_execute(f'CREATE DATABASE "{name}"'))
    try:
        yield _postgres_url(name)
    finally:
        asyncio.run(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database for this test session, for the tests that want it empty."""
    with _throwaway_postgres() as url:
        yield url


async def _reset_postgres_schema(url: str) -> None:
    connection = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        await connection.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    finally:
        await connection.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def database_location(database_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where this test's database lives (a sync fixture: the session database is made here)."""
    if database_backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
    return request.getfixturevalue("postgres_database")


@pytest.fixture
async def database_url(database_backend: str, database_location: str) -> str:
    """An empty database of the current backend."""
    if database_backend == "postgresql":
        await _reset_postgres_schema(database_location)
    return database_location


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file built by the migrations, once per session; each test gets a copy."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    upgrade_database(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_migrated() -> Iterator[str]:
    """A PostgreSQL database built by the migrations, once per session; each test empties it."""
    with _throwaway_postgres() as url:
        upgrade_database(url)
        yield url


async def _empty_tables(url: str) -> None:
    connection = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        tables = await connection.fetch(
            "SELECT quote_ident(tablename) FROM pg_tables"
            f" WHERE schemaname = 'public' AND tablename <> '{VERSION_TABLE}'"
        )
        names = ", ".join(row[0] for row in tables)
        await connection.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    finally:
        await connection.close()


@pytest.fixture
def migrated_database_url(
    database_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> str:
    """A database at the migrations' head (never built by `create_all`), as the migrations left
    it. (A sync fixture: the session's own upgrade runs an event loop.)"""
    if database_backend == "sqlite":
        path = tmp_path / "test.db"
        # the backup API copies a consistent snapshot, whatever the template's WAL holds
        source = str(request.getfixturevalue("sqlite_template"))
        with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(path)) as dst:
            src.backup(dst)
        return f"sqlite+aiosqlite:///{path}"
    # Not a CREATE DATABASE ... TEMPLATE copy per test: on PostgreSQL 15 that measured slower
    # than migrating (the copy writes all ~7.5 MB, catalogs included, to the WAL; DROP DATABASE
    # forces a checkpoint). The migrations insert no rows, so empty tables are their state.
    url = request.getfixturevalue("postgres_migrated")
    asyncio.run(_empty_tables(url))
    return url


@pytest.fixture
async def db_engine(migrated_database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(migrated_database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def db_sessions(db_engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return make_sessionmaker(db_engine)


@pytest.fixture
def fast_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cheap argon2 parameters: the real ones cost ~0.25 s per hash, which adds up in tests."""
    monkeypatch.setattr(
        passwords, "hasher", PasswordHasher(time_cost=1, memory_cost=256, parallelism=1)
    )
    monkeypatch.setattr(passwords, "_DUMMY_HASH", None)


@pytest.fixture
def make_user(
    db_sessions: async_sessionmaker[AsyncSession], fast_password_hashing: None
) -> Callable[..., Awaitable[User]]:
    """`await make_user("a@example.com", is_admin=False)`; the password is TEST_PASSWORD."""
    from app.domain.accounts.service import create_user

    async def make(
        email: str | None = None, *, password: str = TEST_PASSWORD, is_admin: bool = False
    ) -> User:
        email = email or f"user-{secrets.token_hex(4)}@example.com"
        return await create_user(db_sessions, email, password, is_admin=is_admin)

    return make
