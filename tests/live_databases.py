"""Throwaway databases for live servers: empty, or at the migrations' head as a copy of a template.

    with migrated_database("postgresql", tmp_path) as url:    # dropped afterwards
        with running_server(server_env("synthetic", url, tmp_path), tmp_path / "s.log") as live:
            ...

Every server start used to migrate its database with `python -m app.cli db upgrade`, a subprocess
of 1.2-1.8 s in a ~4 s start (the live tier starts ~70 servers). Now each process migrates one
template per backend that way, once (so the real command still runs on both backends in every
test process), and each database is a copy of it: SQLite's backup API (milliseconds), PostgreSQL's
CREATE DATABASE ... TEMPLATE (~0.2 s, against ~0.3 s to create an empty one). The templates go
when the process exits. The tests of the migrations themselves (tests/db, tests/ops'
`release:` command) migrate for real, not from a copy.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.live_server import TEST_POSTGRES_URL, upgrade


async def _postgres_admin(sql: str) -> None:
    import asyncpg

    dsn = make_url(TEST_POSTGRES_URL).set(drivername="postgresql")
    connection = await asyncpg.connect(dsn.render_as_string(hide_password=False))
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def _postgres_url(name: str) -> str:
    return (
        make_url(TEST_POSTGRES_URL)
        .set(drivername="postgresql+asyncpg", database=name)
        .render_as_string(hide_password=False)
    )


def _drop_postgres(name: str) -> None:
    asyncio.run(_postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


_templates: dict[str, str] = {}
_templates_lock = threading.Lock()


def _template(backend: str) -> str:
    """This process's database of `backend` at the migrations' head, migrated once by the real
    `python -m app.cli db upgrade`; removed when the process exits."""
    with _templates_lock:
        if backend not in _templates:
            directory = Path(tempfile.mkdtemp(prefix="streamchat-live-template-"))
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            if backend == "sqlite":
                url = f"sqlite+aiosqlite:///{directory / 'template.db'}"
            else:
                name = f"streamchat_live_template_{secrets.token_hex(6)}"
                asyncio.run(_postgres_admin(f'CREATE DATABASE "{name}"'))
                atexit.register(_drop_postgres, name)
                url = _postgres_url(name)
            upgrade({**os.environ, "DATABASE_URL": url}, directory / "upgrade.log")
            _templates[backend] = url
        return _templates[backend]


@contextlib.contextmanager
def throwaway_database(backend: str, directory: Path, *, migrated: bool = False) -> Iterator[str]:
    """A database of its own: a SQLite file in `directory`, or a PostgreSQL database with a
    random name on TEST_POSTGRES_URL's server, dropped afterwards. Empty, or with `migrated` at
    the migrations' head: a copy of this process's template (see `migrated_database`)."""
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"unknown backend {backend!r}")
    template = _template(backend) if migrated else None
    if backend == "sqlite":
        path = directory / f"live-{secrets.token_hex(4)}.db"
        if template is not None:
            directory.mkdir(parents=True, exist_ok=True)  # as the server would for an empty one
            # the backup API copies a consistent snapshot, whatever the template's WAL holds
            source = make_url(template).database or ""
            with contextlib.closing(sqlite3.connect(source)) as src:
                with contextlib.closing(sqlite3.connect(path)) as dst:
                    src.backup(dst)
        yield f"sqlite+aiosqlite:///{path}"
        return
    name = f"streamchat_live_{secrets.token_hex(6)}"
    copy = f' TEMPLATE "{make_url(template).database}"' if template is not None else ""
    asyncio.run(_postgres_admin(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield _postgres_url(name)
    finally:
        _drop_postgres(name)


def migrated_database(backend: str, directory: Path) -> contextlib.AbstractContextManager[str]:
    """A throwaway database at the migrations' head, for a server started with `migrate=False`.
    It is a copy of a database the real migrations built once in this process (SQLite: the
    backup API; PostgreSQL: CREATE DATABASE ... TEMPLATE, ~0.2 s), not a fresh `db upgrade`."""
    return throwaway_database(backend, directory, migrated=True)
