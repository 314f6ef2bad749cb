"""Operator commands that need no web server.

    python -m app.cli db upgrade [REVISION]     migrate to REVISION (default: head)
    python -m app.cli db downgrade REVISION     migrate down (e.g. -1, or base)
    python -m app.cli db current                print the database's revision
    python -m app.cli create-admin EMAIL [--password PASSWORD]
    python -m app.cli create-user EMAIL [--password PASSWORD]

`create-admin` creates the user, or promotes an existing one (setting the password only when one
is given); it asks for the password when a new user needs one and none was given. `create-user` makes an
ordinary, active account (the way in under SIGNUP_MODE=closed), recorded in the audit log as made
by "cli". The database is
DATABASE_URL, or the SQLite file under DATA_DIR (see app/settings.py).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from collections.abc import Sequence

from app.db.engine import create_engine, make_sessionmaker
from app.db.migrate import current_revision, downgrade_database, upgrade_database
from app.domain.accounts import audit, passwords
from app.domain.accounts.service import create_or_promote_admin, create_user, get_user_by_email
from app.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    db = commands.add_parser("db", help="database migrations")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="apply migrations")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = db_commands.add_parser("downgrade", help="revert migrations")
    downgrade.add_argument("revision")
    db_commands.add_parser("current", help="show the current revision")

    admin = commands.add_parser("create-admin", help="create an admin, or promote a user")
    admin.add_argument("email")
    admin.add_argument("--password", help="set this password (asked for when creating)")

    user = commands.add_parser("create-user", help="create an ordinary, active account")
    user.add_argument("email")
    user.add_argument("--password", help="its password (asked for when not given)")
    return parser


def _ask_password() -> str:
    while True:
        password = getpass.getpass("Password: ")
        try:
            passwords.check_password_strength(password)
        except passwords.WeakPasswordError as exc:
            print(exc, file=sys.stderr)
            continue
        if getpass.getpass("Again: ") == password:
            return password
        print("The passwords differ; try again.", file=sys.stderr)


async def _create_admin(database_url: str, email: str, password: str | None) -> str:
    engine = create_engine(database_url)
    try:
        sessions = make_sessionmaker(engine)
        if password is None and await get_user_by_email(sessions, email) is None:
            password = await asyncio.to_thread(_ask_password)
        user, created = await create_or_promote_admin(sessions, email, password)
    finally:
        await engine.dispose()
    return f"{'created' if created else 'promoted'} admin {user.email}"


async def _create_user(database_url: str, email: str, password: str | None) -> str:
    if password is None:
        password = await asyncio.to_thread(_ask_password)
    engine = create_engine(database_url)
    try:
        sessions = make_sessionmaker(engine)
        user = await create_user(sessions, email, password, is_admin=False)
        await audit.record_now(sessions, audit.CLI, "create", user)
    finally:
        await engine.dispose()
    return f"created user {user.email}"


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    args = _parser().parse_args(argv)
    database_url = (settings or Settings.from_env()).database_url
    try:
        if args.command == "db":
            if args.db_command == "upgrade":
                upgrade_database(database_url, args.revision)
            elif args.db_command == "downgrade":
                downgrade_database(database_url, args.revision)
            print(asyncio.run(current_revision(database_url)) or "(no revision)")
        elif asyncio.run(current_revision(database_url)) is None:
            print(
                "error: the database has no schema: run `python -m app.cli db upgrade`",
                file=sys.stderr,
            )
            return 1
        elif args.command == "create-user":
            print(asyncio.run(_create_user(database_url, args.email, args.password)))
        else:
            print(asyncio.run(_create_admin(database_url, args.email, args.password)))
    except ValueError as exc:  # weak password, taken email, bad input
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
