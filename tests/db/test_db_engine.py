"""Engine wiring: URL spellings, and the SQLite settings a streaming server depends on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import text

from app.db.engine import SQLITE_BUSY_TIMEOUT_MS, create_engine, normalize_database_url
from app.domain.accounts import service as accounts
from app.domain.chat.conversations import store as conversations
from app.settings import Settings
from tests.db.alchemy_config import make_alchemy_config
from tests.db.chat_rows import add_turn, finish_reply, shown_messages


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


async def test_sqlite_busy_timeout_is_a_setting(tmp_path: Path) -> None:
    """DATABASE_BUSY_TIMEOUT_S reaches SQLite (the live stall tests shorten it)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}", busy_timeout_s=1.25)
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(text("PRAGMA busy_timeout"))).scalar() == 1250
    finally:
        await engine.dispose()


async def test_litestar_config_sessions_serve_the_services(
    migrated_database_url: str, fast_password_hashing: None
) -> None:
    """The web layer will hand the plugin's sessionmaker to the services: it must just work."""
    settings = dataclasses.replace(Settings(), database_url=migrated_database_url)
    config = make_alchemy_config(settings)
    assert config.create_all is False
    sessions = config.create_session_maker()
    try:
        user = await accounts.create_user(sessions, "web@example.com", "long enough")
        conversation = await conversations.create_conversation(sessions, user.id, "via the plugin")
        _, reply = await add_turn(sessions, conversation.id, "hi", "m")
        assert await finish_reply(sessions, reply.id, "completed", text="hello")
        messages = await shown_messages(sessions, user.id, conversation.id)
        assert [m.content for m in messages or []] == ["hi", "hello"]
    finally:
        await config.get_engine().dispose()
