"""`INSERT ... ON CONFLICT (key) DO UPDATE`: one statement that writes a row whether or not it is
there yet, on SQLite and PostgreSQL alike.

A read-then-insert races: two requests both find no row, both insert, and the second fails on the
primary key (a 500). The database's own upsert settles the race under its own lock. Both
dialects' `insert` constructs take the same `on_conflict_do_update(index_elements, set_)`
(sqlalchemy/dialects/sqlite/dml.py, sqlalchemy/dialects/postgresql/dml.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def upsert(
    session: AsyncSession, model: type[Any], key: Mapping[str, Any], values: Mapping[str, Any]
) -> Any:
    """The statement that sets `values` on the row of `model` whose primary key is `key`,
    inserting the row (with its columns' defaults) if there is none. `values` are all that an
    update sets: name `updated_at` there if the row has one (`onupdate` is not applied).
    Add `.returning(...)` to read the row back."""
    insert = _INSERTS[session.get_bind().dialect.name](model).values({**key, **values})
    return insert.on_conflict_do_update(index_elements=list(key), set_=dict(values))
