"""Apply the Alembic migrations in `migrations/` from code, from the CLI, or from tests.

The schema is only ever created by migrations (never `create_all`), so what runs in production is
what the tests run. Migrations always use their own short-lived connection (no pool): on SQLite
env.py turns foreign keys off for the duration (batch mode rebuilds tables, and dropping a parent
table with foreign keys on would cascade), and such a connection must not go back into a pool.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, inspect
from sqlalchemy.pool import NullPool

from app.db.engine import create_engine, normalize_database_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = PROJECT_ROOT / "migrations"
ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"
VERSION_TABLE = "alembic_version"
"""Alembic's own default name, kept so a plain `alembic` command finds the same history."""


def alembic_config(database_url: str | None = None) -> Config:
    """An Alembic `Config` for our migrations; env.py reads the URL from `attributes`.

    (Passing the URL through `attributes` rather than `sqlalchemy.url` avoids configparser's
    `%`-interpolation mangling percent-encoded passwords.)
    """
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url is not None:
        config.attributes["database_url"] = normalize_database_url(database_url)
    return config


def head_revision() -> str | None:
    """The newest revision in migrations/ (what `upgrade head` reaches)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _run(connection: Connection, action: str, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    getattr(command, action)(config, revision)


async def _run_async(database_url: str, action: str, revision: str) -> None:
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run, action, revision)
            await connection.commit()
    finally:
        await engine.dispose()


async def upgrade_database_async(database_url: str, revision: str = "head") -> None:
    """Migrate the database at `database_url` up to `revision`; for use inside an event loop."""
    await _run_async(database_url, "upgrade", revision)


async def downgrade_database_async(database_url: str, revision: str) -> None:
    """Migrate down to `revision` (`"base"` drops everything the migrations created)."""
    await _run_async(database_url, "downgrade", revision)


def upgrade_database(database_url: str, revision: str = "head") -> None:
    """Blocking `upgrade_database_async`, for scripts and the CLI (no event loop may be running)."""
    asyncio.run(upgrade_database_async(database_url, revision))


def downgrade_database(database_url: str, revision: str) -> None:
    """Blocking `downgrade_database_async`."""
    asyncio.run(downgrade_database_async(database_url, revision))


async def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None when it has never been migrated."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_current_revision)
    finally:
        await engine.dispose()


def _current_revision(connection: Connection) -> str | None:
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()
