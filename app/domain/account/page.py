"""The account page (`/account`): the user's own password, sessions, export, who looked at their
conversations, and deleting the account. The page is a shell; static/js/account-page.js fills it
from the account API (app/domain/account/api.py)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from app.db.session import Sessions
from app.domain.accounts.dependencies import logged_in_user


@get("/account", include_in_schema=False)
async def account_page(
    request: Request[UUID | None, Any, Any], sessions: NamedDependency[Sessions]
) -> Template | Redirect:
    user = await logged_in_user(request, sessions)
    if user is None:  # anonymous, or waiting for approval (the chat's address shows that page)
        return Redirect("/" if request.auth else "/login")
    return Template(
        "account.html", context={"user": {"email": user.email, "is_admin": user.is_admin}}
    )
