"""Engine wiring: URL spellings, and the SQLite settings a streaming server depends on."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from app.db.engine import SQLITE_BUSY_TIMEOUT_MS, create_engine, normalize_database_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgres://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgresql://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db?sslmode=require", "postgresql+asyncpg://u@h/db?ssl=require"),
        ("postgres://u:p%40ss@h/db", "postgresql+asyncpg://u:p%40ss@h/db"),
        ("sqlite:///data/x.db", "sqlite+aiosqlite:///data/x.db"),
        ("sqlite+aiosqlite:////abs/x.db", "sqlite+aiosqlite:////abs/x.db"),
    ],
)
def test_normalize_database_url(given: str, expected: str) -> None:
    assert normalize_database_url(given) == expected


async def test_sqlite_file_gets_its_folder_wal_busy_timeout_and_foreign_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "not" / "yet" / "there.db"
    engine = create_engine(f"sqlite:///{path}")
    try:
        async with engine.connect() as connection:
            pragmas = {
                name: (await connection.execute(text(f"PRAGMA {name}"))).scalar()
                for name in ("journal_mode", "busy_timeout", "foreign_keys", "synchronous")
            }
    finally:
        await engine.dispose()
    assert path.exists()
    assert pragmas == {
        "journal_mode": "wal",
        "busy_timeout": SQLITE_BUSY_TIMEOUT_MS,
        "foreign_keys": 1,
        "synchronous": 1,  # NORMAL
    }
