"""The logged-in user's row, for the routes that read it: `connection.user` (set by the
authentication middleware, app/domain/accounts/authentication.py) holds only the user's id.

Routes that need no more than the id take it from `request.user`; the sending route does, since
its own query checks that the user still exists (a round trip fewer on the hot path). The others
name `user` (`Provide(provide_user)`), which is also what answers 401 for a session whose account
was deleted since.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException

from app.db.session import Sessions
from app.domain.accounts import service as accounts
from app.domain.accounts.models import User


async def logged_in_user(
    connection: ASGIConnection[Any, UUID | None, Any, Any], sessions: Sessions
) -> User | None:
    """The row of `connection.user`, or None: anonymous, or the account was deleted since."""
    user_id = connection.user
    return None if user_id is None else await accounts.get_user(sessions, user_id)


async def provide_user(
    request: Request[UUID | None, Any, Any], sessions: NamedDependency[Sessions]
) -> User:
    """`user`: the logged-in user's row; 401 without one."""
    user = await logged_in_user(request, sessions)
    if user is None:
        raise NotAuthorizedException("log in first")
    return user
