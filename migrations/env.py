"""Alembic environment for SQLite and PostgreSQL, sync or async callers.

It is entered three ways, and finds its database accordingly:
- from `app.db.migrate` (the app, the CLI, the tests): a live connection in `attributes`;
- from advanced-alchemy's `litestar database ...` commands: a config carrying `db_url`;
- from a plain `alembic ...` command: DATABASE_URL, or the SQLite default of app/settings.py.
Batch mode is always on: SQLite can only alter a table by rebuilding it, and on PostgreSQL batch
operations are plain ALTERs.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.pool import NullPool

from app.db.base import Base
from app.db.engine import create_engine, normalize_database_url
from app.db.migrate import VERSION_TABLE
from app.domain.accounts import models as accounts_models
from app.domain.chat import models as chat_models
from app.domain.chat import settings_models as chat_settings_models
from app.domain.quotas import models as quota_models

# Every model, registered here so that `Base.metadata` holds the whole schema for autogenerate:
# the domain packages own their models, and the database layer never imports them.
REGISTERED_MODELS = (accounts_models, chat_models, chat_settings_models, quota_models)

config = context.config
target_metadata = Base.metadata

if config.cmd_opts is not None and config.config_file_name is not None:
    fileConfig(config.config_file_name)  # only under the alembic CLI: never reconfigure the app


def _database_url() -> str:
    url = config.attributes.get("database_url") or getattr(config, "db_url", None)
    if url is None:
        from app.settings import Settings

        url = Settings.from_env().database_url
    return normalize_database_url(url)


def _configure(compare_type: bool = True, **kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        compare_type=compare_type,
        **kwargs,
    )


def run_migrations_offline() -> None:
    """`--sql` mode: print the SQL instead of running it."""
    _configure(url=_database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    if connection.dialect.name == "sqlite":
        # Must precede any transaction; the connection is thrown away afterwards (NullPool).
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    # SQLite reflects custom types by affinity only (BINARY(16) reads back as NUMERIC), so
    # autogenerate compares types on PostgreSQL only; generate revisions against PostgreSQL.
    _configure(connection=connection, compare_type=connection.dialect.name != "sqlite")
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    engine = create_engine(_database_url(), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
elif (connection := config.attributes.get("connection")) is not None:
    do_run_migrations(connection)
else:
    asyncio.run(run_migrations_online())
