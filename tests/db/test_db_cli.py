"""`python -m app.cli`: migrations, creating or promoting an admin, and creating an ordinary
account (the way in under SIGNUP_MODE=closed besides the users page)."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import subprocess
import sys

import pytest
from sqlalchemy import select

from app import cli
from app.db.engine import create_engine, make_sessionmaker
from app.db.migrate import PROJECT_ROOT, head_revision
from app.domain.accounts.models import AuditEntry, User, UserState
from app.domain.accounts.service import authenticate, get_user_by_email
from app.settings import Settings

HEAD = head_revision()


def _settings(url: str) -> Settings:
    return dataclasses.replace(Settings(), database_url=url)


async def _user(url: str, email: str, password: str | None = None) -> User | None:
    engine = create_engine(url)
    try:
        sessions = make_sessionmaker(engine)
        if password is not None:
            return await authenticate(sessions, email, password)
        return await get_user_by_email(sessions, email)
    finally:
        await engine.dispose()


def test_db_upgrade_and_downgrade(
    database_url: str, capsys: pytest.CaptureFixture[str], fast_password_hashing: None
) -> None:
    settings = _settings(database_url)
    assert cli.main(["db", "current"], settings) == 0
    assert capsys.readouterr().out.strip() == "(no revision)"
    assert cli.main(["create-admin", "a@example.com", "--password", "long enough"], settings) == 1
    assert "db upgrade" in capsys.readouterr().err

    assert cli.main(["db", "upgrade"], settings) == 0
    assert capsys.readouterr().out.strip() == HEAD
    assert cli.main(["db", "downgrade", "base"], settings) == 0
    assert capsys.readouterr().out.strip() == "(no revision)"


def test_create_admin_creates_then_promotes(
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fast_password_hashing: None,
) -> None:
    settings = _settings(database_url)
    assert cli.main(["db", "upgrade"], settings) == 0

    answers = iter(["short", "a fine password", "a fine password"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(answers))
    assert cli.main(["create-admin", "Admin@Example.com"], settings) == 0
    assert "created admin admin@example.com" in capsys.readouterr().out
    admin = asyncio.run(_user(database_url, "admin@example.com", "a fine password"))
    assert admin is not None and admin.is_admin

    # A second, ordinary user, promoted without touching their password.
    assert cli.main(["create-admin", "x@example.com", "--password", "other pass"], settings) == 0
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": pytest.fail("must not prompt"))
    assert cli.main(["create-admin", "X@example.com"], settings) == 0
    assert "promoted admin x@example.com" in capsys.readouterr().out
    promoted = asyncio.run(_user(database_url, "x@example.com", "other pass"))
    assert promoted is not None and promoted.is_admin

    assert cli.main(["create-admin", "y@example.com", "--password", "short"], settings) == 2
    assert asyncio.run(_user(database_url, "y@example.com")) is None


async def _audit_actions(url: str) -> list[tuple[str, str, str | None]]:
    engine = create_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            entries = await session.scalars(select(AuditEntry).order_by(AuditEntry.created_at))
            return [(e.actor_email, e.action, e.target_email) for e in entries]
    finally:
        await engine.dispose()


def test_create_user_makes_an_active_ordinary_account_under_closed_sign_up(
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fast_password_hashing: None,
) -> None:
    settings = dataclasses.replace(_settings(database_url), signup_mode="closed")
    assert cli.main(["db", "upgrade"], settings) == 0
    assert (
        cli.main(["create-admin", "boss@example.com", "--password", "a fine pass"], settings) == 0
    )
    capsys.readouterr()

    assert cli.main(["create-user", "Ann@Example.com", "--password", "her own pass"], settings) == 0
    assert "created user ann@example.com" in capsys.readouterr().out
    ann = asyncio.run(_user(database_url, "ann@example.com", "her own pass"))
    assert ann is not None and not ann.is_admin and ann.state == UserState.ACTIVE
    answers = iter(["a prompted password", "a prompted password"])  # and again
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": next(answers))
    assert cli.main(["create-user", "bo@example.com"], settings) == 0  # asks for it
    assert asyncio.run(_user(database_url, "bo@example.com", "a prompted password")) is not None

    assert cli.main(["create-user", "ANN@example.com", "--password", "x pass 2"], settings) == 2
    assert "error:" in capsys.readouterr().err  # taken
    assert cli.main(["create-user", "cy@example.com", "--password", "short"], settings) == 2
    assert asyncio.run(_user(database_url, "cy@example.com")) is None
    created = [a for a in asyncio.run(_audit_actions(database_url)) if a[1] == "create"]
    assert created == [("cli", "create", "ann@example.com"), ("cli", "create", "bo@example.com")]


def test_module_entry_point(database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade"],
        cwd=PROJECT_ROOT,
        env={"DATABASE_URL": database_url, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == HEAD
