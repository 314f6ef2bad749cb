"""`GET /api/quota`: the logged-in user's token quotas as they stand, for the page's notice when
little is left (static/js/quota.js)."""

from __future__ import annotations

from litestar import Router, get
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotAuthorizedException

from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.models import User
from app.domain.errors import NotLoggedInError
from app.domain.quotas.service import Quotas, QuotaView
from app.domain.refusals import documented


@get("/quota", raises=documented(NotAuthorizedException, NotLoggedInError))
async def my_quota(quotas: NamedDependency[Quotas], user: NamedDependency[User]) -> QuotaView:
    """The limits in force (null: none), tokens used and left this UTC day and month, when each
    resets, and `low` when less than a tenth of a limit is left."""
    state = await quotas.status(user.id)
    if state is None:  # deleted since the session was checked
        raise NotLoggedInError()
    return state.view()


quota_router = Router(
    "/api",
    route_handlers=[my_quota],
    guards=[logged_in],
    dependencies={"user": Provide(provide_user)},
    tags=["account"],
)
