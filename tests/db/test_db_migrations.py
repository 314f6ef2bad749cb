"""The migrations build the schema the models describe, on SQLite and PostgreSQL, and undo it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

from advanced_alchemy.alembic.commands import AlembicCommands
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect
from sqlalchemy.pool import NullPool

from app.db.base import Base
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
from app.domain.chat import settings_models as chat_settings_models
from app.domain.quotas import models as quota_models
from app.settings import Settings
from tests.db.alchemy_config import make_alchemy_config

REGISTERED_MODELS = (
    accounts_models,
    chat_models,
    chat_settings_models,
    quota_models,
)  # as migrations/env.py registers them

OUR_TABLES = {"users", "api_keys", "conversations", "messages", "reply_ratings"}
OUR_TABLES |= {"conversation_settings", "user_chat_defaults"}  # 0006
OUR_TABLES |= {"account_tokens", "audit_log"}  # 0008
OUR_TABLES |= {"quota_usage"}  # 0011
OUR_TABLES |= {"account_sessions"}  # 0012
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


def _constraints(connection: Connection, schema: str | None = None) -> dict[str, object]:
    """What autogenerate does not compare: every column's type and nullability, CHECK constraints
    (an enum's values and name live there) and foreign keys (with their ON DELETE)."""
    inspector = inspect(connection)
    found: dict[str, object] = {}
    for table in sorted(OUR_TABLES):
        columns = inspector.get_columns(table, schema=schema)
        foreign_keys = inspector.get_foreign_keys(table, schema=schema)
        found[table] = {
            "columns": sorted((c["name"], str(c["type"]), c["nullable"]) for c in columns),
            "checks": sorted(
                (c["name"], c["sqltext"])
                for c in inspector.get_check_constraints(table, schema=schema)
            ),
            "foreign_keys": sorted(
                (
                    fk["name"],
                    tuple(fk["constrained_columns"]),
                    fk["referred_table"],
                    tuple(fk["referred_columns"]),
                    fk["options"].get("ondelete"),
                )
                for fk in foreign_keys
            ),
        }
    return found


async def _built_from_the_models(database_url: str, tmp_path: Path) -> dict[str, object]:
    """`_constraints` of a database built by `create_all` from the models (not the migrations):
    a second SQLite file, or a second schema of the PostgreSQL database."""
    if database_url.startswith("sqlite"):
        url, schema, translate = f"sqlite+aiosqlite:///{tmp_path / 'models.db'}", None, {}
    else:
        url, schema = database_url, "from_models"
        translate = {None: schema}
    engine = create_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            if schema is not None:
                await connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            await connection.run_sync(
                lambda sync: Base.metadata.create_all(
                    sync.execution_options(schema_translate_map=translate)
                )
            )
        async with engine.connect() as connection:
            return await connection.run_sync(_constraints, schema)
    finally:
        if schema is not None:
            async with engine.begin() as connection:
                await connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await engine.dispose()


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
        "ix_reply_ratings_updated_at",
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


async def test_models_and_migrations_build_the_same_types_and_constraints(
    migrated_database_url: str, tmp_path: Path
) -> None:
    """Autogenerate compares no CHECK constraint (nor, on SQLite, any type): an enum's values,
    name or length changed in a model without a migration show here instead."""
    migrated = await _inspect(migrated_database_url, _constraints)
    assert migrated["messages"]["checks"]  # type: ignore[index]  # the scan sees the enums
    assert await _built_from_the_models(migrated_database_url, tmp_path) == migrated


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
