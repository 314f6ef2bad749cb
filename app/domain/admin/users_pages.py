"""The users page and the audit log page of the admin console: plain forms (CSRF token in each),
each action a POST that redirects back (303), or shows the page again with why it was refused or
the one-time link it made. The work is in app/domain/accounts/ (management.py, links.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency, Provide
from litestar.enums import RequestEncodingType
from litestar.exceptions import ClientException
from litestar.params import Body, FromPath, FromQuery
from litestar.response import Redirect, Template

from app.db.session import Sessions
from app.domain.accounts import audit, links, management
from app.domain.accounts import service as accounts
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import admin_guard
from app.domain.accounts.models import User, UserState
from app.domain.admin import user_queries
from app.domain.admin.acting import actor, changed
from app.domain.admin.user_views import PAGE_SIZE, entry_json, parse_state, row_json, search_text
from app.domain.chat.sign_outs import SignOuts
from app.domain.errors import DomainError
from app.domain.quotas import overrides
from app.settings import Settings

MAX_PAGE = 1_000_000
ACTIONS = {
    "approve": management.approve,
    "disable": management.disable,
    "enable": management.enable,
    "logout": management.end_sessions,
    "delete": management.delete_user,
}
SIGNS_OUT = {"disable": "disabled", "delete": "deleted", "logout": "logged_out"}
"""The actions that end the user's sessions: their sockets and replies end too, at once."""


@dataclass
class NewUserForm:
    email: str = ""
    password: str = ""
    role: str = "user"


@dataclass
class QuotaForm:
    per_day: str = ""  # empty: the default
    per_month: str = ""


@dataclass
class InviteForm:
    email: str = ""


@dataclass
class RoleForm:
    role: str = "user"


Form = Body(media_type=RequestEncodingType.URL_ENCODED)


class AdminUserPages(Controller):
    path = "/admin"
    guards = [admin_guard]
    include_in_schema = False
    dependencies = {"user": Provide(provide_user)}  # the acting admin

    async def _users_page(
        self,
        request: Request,
        sessions: Sessions,
        settings: Settings,
        *,
        status_code: int = 200,
        **shown: Any,
    ) -> Template:
        q = request.query_params.get("q")
        state = request.query_params.get("state")
        try:
            page = min(max(1, int(request.query_params.get("page") or 1)), MAX_PAGE)
        except ValueError as exc:
            raise ClientException("page must be a number") from exc
        search, wanted = search_text(q, "q"), parse_state(state)
        rows, total = await user_queries.list_users(
            sessions, search=search, state=wanted, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
        )
        return Template(
            "admin/users.html",
            context=dict(
                users=[row_json(r) for r in rows],
                total=total,
                page=page,
                pages=max(1, -(-total // PAGE_SIZE)),
                filters={"q": q or "", "state": state or ""},
                states=[s.value for s in UserState],
                signup_mode=settings.signup_mode,
                quota_defaults={
                    "per_day": settings.quota_tokens_per_day,
                    "per_month": settings.quota_tokens_per_month,
                },
                me=str(request.user),
                **shown,
            ),
            status_code=status_code,
        )

    @get("/users")
    async def users(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
    ) -> Template:
        return await self._users_page(request, sessions, settings)

    @post("/users/{user_id:uuid}/{action:str}", status_code=303)
    async def act(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        user_id: FromPath[UUID],
        action: FromPath[str],
    ) -> Redirect | Template:
        change = ACTIONS.get(action)
        if change is None:
            return await self._users_page(
                request, sessions, settings, status_code=404, error="no such action"
            )
        try:
            await change(sessions, actor(request, user), user_id)
        except DomainError as exc:
            return await self._users_page(
                request, sessions, settings, status_code=exc.status, error=exc.public_message
            )
        changed(request, user_id)
        if action in SIGNS_OUT:
            sign_outs.sign_out(user_id, SIGNS_OUT[action])
        return Redirect("/admin/users", status_code=303)

    @post("/users/{user_id:uuid}/role/set", status_code=303)
    async def set_role(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
        data: Annotated[RoleForm, Form],
    ) -> Redirect | Template:
        try:
            await management.set_role(sessions, actor(request, user), user_id, data.role == "admin")
        except DomainError as exc:
            return await self._users_page(
                request, sessions, settings, status_code=exc.status, error=exc.public_message
            )
        return Redirect("/admin/users", status_code=303)

    @post("/users/{user_id:uuid}/quota/set", status_code=303)
    async def set_quota(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
        data: Annotated[QuotaForm, Form],
    ) -> Redirect | Template:
        try:
            per_day = overrides.parse_form_limit(data.per_day, "per_day")
            per_month = overrides.parse_form_limit(data.per_month, "per_month")
            await overrides.set_limits(sessions, actor(request, user), user_id, per_day, per_month)
        except DomainError as exc:
            return await self._users_page(
                request, sessions, settings, status_code=exc.status, error=exc.public_message
            )
        return Redirect("/admin/users", status_code=303)

    @post("/users/{user_id:uuid}/reset-link", status_code=200)
    async def reset_link(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
    ) -> Template:
        try:
            target, secret = await links.create_reset_link(sessions, actor(request, user), user_id)
        except DomainError as exc:
            return await self._users_page(
                request, sessions, settings, status_code=exc.status, error=exc.public_message
            )
        link = f"{request.base_url}reset#token={secret}"
        return await self._users_page(
            request, sessions, settings, link=link, link_for=f"Password reset for {target.email}"
        )

    @post("/users/new", status_code=303)
    async def create_user(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        data: Annotated[NewUserForm, Form],
    ) -> Redirect | Template:
        try:
            created = await accounts.create_user(
                sessions, data.email, data.password, is_admin=data.role == "admin"
            )
        except DomainError as exc:
            return await self._users_page(
                request, sessions, settings, status_code=exc.status, error=exc.public_message
            )
        await audit.record_now(sessions, actor(request, user), "create", created)
        return Redirect("/admin/users", status_code=303)

    @post("/invitations", status_code=200)
    async def invite(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        user: NamedDependency[User],
        data: Annotated[InviteForm, Form],
    ) -> Template:
        email = data.email.strip() or None
        token, secret = await links.create_invite(sessions, actor(request, user), email)
        link = f"{request.base_url}signup#invite={secret}"
        for_whom = f"for {token.email}" if token.email else "for anyone"
        return await self._users_page(
            request, sessions, settings, link=link, link_for=f"Invitation {for_whom}, single use"
        )

    @get("/audit")
    async def audit_log(
        self,
        sessions: NamedDependency[Sessions],
        action: FromQuery[str | None] = None,
        who: FromQuery[str | None] = None,
        page: FromQuery[int] = 1,
    ) -> Template:
        page = min(max(1, page), MAX_PAGE)
        filters = audit.AuditFilter(
            action=search_text(action, "action"), user=search_text(who, "who")
        )
        entries, total = await audit.list_entries(
            sessions, filters, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
        )
        return Template(
            "admin/audit.html",
            context=dict(
                entries=[entry_json(e) for e in entries],
                total=total,
                page=page,
                pages=max(1, -(-total // PAGE_SIZE)),
                filters={"action": action or "", "who": who or ""},
                actions=audit.ACTIONS,
            ),
        )
