"""One short transaction per service call.

The streaming core writes from many tasks at once (a flush per running reply every second), so no
session is ever held across an `await` on the engine or the network: each service function opens a
session, does its work, commits and lets go. Callers pass an `async_sessionmaker`; the objects that
come back are detached but fully loaded, whatever `expire_on_commit` that sessionmaker was built
with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

Sessions = async_sessionmaker[AsyncSession]
"""What every service function takes first: the app's session factory."""


@asynccontextmanager
async def transaction(sessions: Sessions) -> AsyncIterator[AsyncSession]:
    """A session inside a transaction: committed on success, rolled back on any exception."""
    async with sessions(expire_on_commit=False) as session, session.begin():
        yield session
