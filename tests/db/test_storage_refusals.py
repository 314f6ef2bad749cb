"""Which driver errors mean "the database refuses writes for want of storage" (app/db/storage.py):
SQLite's and PostgreSQL's codes for a full disk and a read-only database, and nothing else (a
locked database is DatabaseBusyError's; a constraint violation is a bug, a 500). The live tests
make the real faults: tests/serving/test_live_storage_full.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.db.storage import FULL, READ_ONLY, storage_refusal


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (SimpleNamespace(sqlite_errorcode=13), FULL),  # SQLITE_FULL
        (SimpleNamespace(sqlite_errorcode=8), READ_ONLY),  # SQLITE_READONLY
        (SimpleNamespace(sqlite_errorcode=8 | (2 << 8)), READ_ONLY),  # READONLY_CANTLOCK...
        (SimpleNamespace(sqlite_errorcode=5), None),  # BUSY: DatabaseBusyError's, not ours
        (SimpleNamespace(sqlstate="53100"), FULL),  # disk_full
        (SimpleNamespace(sqlstate="25006"), READ_ONLY),  # read_only_sql_transaction
        (SimpleNamespace(sqlstate="23505"), None),  # a unique violation: a bug, a 500
        (ValueError("x"), None),
    ],
)
def test_the_refusals_are_told_apart_from_bugs(error: object, kind: str | None) -> None:
    assert storage_refusal(error) == kind
