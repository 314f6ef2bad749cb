"""The migrations build the schema the models describe, on SQLite and PostgreSQL, and undo it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import warnings

from advanced_alchemy.alembic.commands import AlembicCommands
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect
from sqlalchemy.pool import NullPool

from app.db.base import Base
from app.db.config import make_alchemy_config
from app.db.engine import create_engine
from app.db.migrate import (
    PROJECT_ROOT,
    VERSION_TABLE,
    current_revision,
    downgrade_database_async,
    head_revision,
    upgrade_database_async,
)
from app.domain.accounts import models as accounts_models
from app.domain.chat import models as chat_models
from app.settings import Settings

REGISTERED_MODELS = (accounts_models, chat_models)  # as migrations/env.py registers them

OUR_TABLES = {"users", "api_keys", "conversations", "messages"}
HEAD = head_revision()


async def _inspect(url: str, fn):  # type: ignore[no-untyped-def]
    engine = create_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(fn)
    finally:
        await engine.dispose()


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _index_names(connection: Connection) -> set[str]:
    inspector = inspect(connection)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*expression-based index.*")
        return {index["name"] for table in OUR_TABLES for index in inspector.get_indexes(table)}


def _schema_diff(connection: Connection) -> list[object]:
    # SQLite reflects our column types by affinity (BINARY(16) comes back NUMERIC), so types are
    # only compared on PostgreSQL; SQLite cannot reflect the lower(email) index at all (the
    # accounts tests check it by behaviour instead).
    compare_type = connection.dialect.name != "sqlite"
    context = MigrationContext.configure(connection, opts={"compare_type": compare_type})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*expression-based index.*")
        return compare_metadata(context, Base.metadata)


async def test_upgrade_builds_the_schema_and_downgrade_removes_it(database_url: str) -> None:
    assert await current_revision(database_url) is None
    assert await _inspect(database_url, _tables) == set()

    await upgrade_database_async(database_url)
    assert await current_revision(database_url) == HEAD
    assert await _inspect(database_url, _tables) == OUR_TABLES | {VERSION_TABLE}
    assert {
        "ix_api_keys_user_id",
        "ix_conversations_user_id_updated_at",
        "ix_messages_conversation_id_created_at",
        "ix_messages_status",
    } <= await _inspect(database_url, _index_names)

    await downgrade_database_async(database_url, "base")
    assert await current_revision(database_url) is None
    assert await _inspect(database_url, _tables) == {VERSION_TABLE}

    await upgrade_database_async(database_url)  # and back up again, from the downgraded state
    assert await current_revision(database_url) == HEAD


async def test_upgrade_twice_is_a_no_op(migrated_database_url: str) -> None:
    await upgrade_database_async(migrated_database_url)
    assert await current_revision(migrated_database_url) == HEAD


async def test_models_and_migrations_agree(migrated_database_url: str) -> None:
    assert await _inspect(migrated_database_url, _schema_diff) == []


def test_advanced_alchemy_alembic_commands_use_our_migrations(
    database_url: str, database_location: str
) -> None:
    """What `litestar database upgrade` runs, driven by the config the web layer will use."""
    settings = dataclasses.replace(Settings(), database_url=database_url)
    AlembicCommands(sqlalchemy_config=make_alchemy_config(settings)).upgrade()
    assert asyncio.run(current_revision(database_url)) == HEAD


def test_litestar_cli_database_upgrade(database_url: str) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "litestar", "--app", "tests.db.litestar_app:app"),
            *("database", "upgrade", "--no-prompt"),
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert asyncio.run(current_revision(database_url)) == HEAD
