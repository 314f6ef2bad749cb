"""The advanced-alchemy configuration a Litestar app would use, for the tests that prove our
migrations work under advanced-alchemy's tooling (the app itself does not use the plugin).

    from advanced_alchemy.extensions.litestar import SQLAlchemyPlugin
    app = Litestar(..., plugins=[SQLAlchemyPlugin(config=make_alchemy_config(settings))])

This puts the engine and a session factory in `app.state`, offers `db_engine` and `db_session` as
dependencies, and makes `litestar database upgrade` (and the other Alembic commands) work on our
`migrations/`. It never creates tables by itself: the schema comes from migrations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from advanced_alchemy.extensions.litestar import (
    AlembicAsyncConfig,
    AsyncSessionConfig,
    SQLAlchemyAsyncConfig,
)

from app.db.base import Base
from app.db.engine import create_engine
from app.db.migrate import ALEMBIC_INI, MIGRATIONS_DIR, VERSION_TABLE

if TYPE_CHECKING:
    from app.settings import Settings


def make_alchemy_config(settings: Settings, **overrides: Any) -> SQLAlchemyAsyncConfig:
    """advanced-alchemy's Litestar config for `settings.database_url`.

    The engine is ours (`app.db.engine.create_engine`: URL normalisation, SQLite WAL and busy
    timeout). Sessions keep their objects loaded after commit, like the service functions expect.
    `overrides` go to `SQLAlchemyAsyncConfig` (e.g. `before_send_handler="autocommit"`).
    """
    options: dict[str, Any] = {
        "engine_instance": create_engine(settings.database_url),
        "metadata": Base.metadata,
        "create_all": False,
        "session_config": AsyncSessionConfig(expire_on_commit=False),
        "alembic_config": AlembicAsyncConfig(
            script_config=str(ALEMBIC_INI),
            script_location=str(MIGRATIONS_DIR),
            version_table_name=VERSION_TABLE,
            render_as_batch=True,
            compare_type=True,
        ),
    }
    options.update(overrides)
    return SQLAlchemyAsyncConfig(**options)
