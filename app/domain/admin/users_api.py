"""The admin API for accounts (`/admin/api/users`, `/admin/api/invitations`, `/admin/api/audit`):
what the users page does, as JSON. Every change goes through app/domain/accounts/management.py
(one transaction with its audit entry; the last active admin stays one).

Each route's `raises=`, for the OpenAPI document: 401 and 403 (`admin_guard`: no session, not an
admin; on writes, Litestar's CSRF check too), then the route's own refusals (and a body's 413, the
database's 503: app/domain/refusals.py). A change that matches
no row says why (`management._refusal`): no such user (404), the last active admin or an account
not in the state the change needs (409).
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.exceptions import ClientException, NotAuthorizedException, PermissionDeniedException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.session import Sessions
from app.domain.accounts import audit, links, management
from app.domain.accounts import service as accounts
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import admin_guard
from app.domain.accounts.management import LastAdminError, UserNotFoundError, WrongStateError
from app.domain.accounts.models import User
from app.domain.accounts.passwords import WeakPasswordError
from app.domain.accounts.service import EmailTakenError, InvalidEmailError
from app.domain.admin import user_queries
from app.domain.admin.acting import actor, changed
from app.domain.admin.user_views import (
    PAGE_SIZE,
    account_json,
    entry_json,
    iso,
    parse_state,
    quota_json,
    row_json,
    search_text,
)
from app.domain.chat.sign_outs import SignOuts
from app.domain.errors import InvalidInputError
from app.domain.quotas import overrides
from app.domain.refusals import documented


class NewUser(msgspec.Struct, forbid_unknown_fields=True):
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    is_admin: bool = False


class Role(msgspec.Struct, forbid_unknown_fields=True):
    is_admin: bool


TokenLimit = Annotated[int, msgspec.Meta(ge=0, le=overrides.MAX_LIMIT)] | None


class QuotaLimits(msgspec.Struct, forbid_unknown_fields=True):
    """A user's token quotas: null follows the server's default, 0 is no limit."""

    per_day: TokenLimit = None
    per_month: TokenLimit = None


class NewInvitation(msgspec.Struct, forbid_unknown_fields=True):
    email: Annotated[str, msgspec.Meta(max_length=320)] | None = None  # only this email may use it


class AdminUsersApi(Controller):
    path = "/admin/api"
    guards = [admin_guard]
    tags = ["admin"]
    dependencies = {"user": Provide(provide_user)}  # the acting admin

    @get(
        "/users",
        raises=documented(NotAuthorizedException, PermissionDeniedException, ClientException),
    )
    async def list_users(
        self,
        sessions: NamedDependency[Sessions],
        q: Annotated[str | None, QueryParameter(max_length=320)] = None,
        wanted: Annotated[str | None, QueryParameter(name="state", max_length=16)] = None,
        page: Annotated[int, QueryParameter(ge=1, le=1_000_000)] = 1,
    ) -> dict[str, Any]:
        rows, total = await user_queries.list_users(
            sessions,
            search=search_text(q, "q"),
            state=parse_state(wanted),
            limit=PAGE_SIZE,
            offset=(page - 1) * PAGE_SIZE,
        )
        return {"users": [row_json(r) for r in rows], "total": total, "page": page}

    @post(
        "/users",
        status_code=HTTP_201_CREATED,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            InvalidEmailError,
            WeakPasswordError,
            EmailTakenError,
            RequestEntityTooLarge,
        ),
    )
    async def create_user(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        data: JSONBody[NewUser],
    ) -> dict[str, Any]:
        """Make an account (any SIGNUP_MODE; the way in under `closed`), active at once."""
        created = await accounts.create_user(
            sessions, data.email, data.password, is_admin=data.is_admin
        )
        await audit.record_now(sessions, actor(request, user), "create", created)
        return account_json(created)

    @post(
        "/users/{user_id:uuid}/approve",
        status_code=200,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            UserNotFoundError,
            LastAdminError,
            WrongStateError,
        ),
    )
    async def approve(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
    ) -> dict[str, Any]:
        done = await management.approve(sessions, actor(request, user), user_id)
        changed(request, user_id)
        return account_json(done)

    @post(
        "/users/{user_id:uuid}/disable",
        status_code=200,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            UserNotFoundError,
            LastAdminError,
            WrongStateError,
        ),
    )
    async def disable(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        user_id: FromPath[UUID],
    ) -> dict[str, Any]:
        done = await management.disable(sessions, actor(request, user), user_id)
        changed(request, user_id)
        sign_outs.sign_out(user_id, "disabled")  # their sockets and replies end at once
        return account_json(done)

    @post(
        "/users/{user_id:uuid}/enable",
        status_code=200,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            UserNotFoundError,
            LastAdminError,
            WrongStateError,
        ),
    )
    async def enable(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
    ) -> dict[str, Any]:
        done = await management.enable(sessions, actor(request, user), user_id)
        changed(request, user_id)
        return account_json(done)

    @put(
        "/users/{user_id:uuid}/role",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            UserNotFoundError,
            LastAdminError,
            WrongStateError,
            RequestEntityTooLarge,
        ),
    )
    async def set_role(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
        data: JSONBody[Role],
    ) -> dict[str, Any]:
        done = await management.set_role(sessions, actor(request, user), user_id, data.is_admin)
        changed(request, user_id)  # a demoted admin's next request here is a user's
        return account_json(done)

    @put(
        "/users/{user_id:uuid}/quota",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            InvalidInputError,
            UserNotFoundError,
            RequestEntityTooLarge,
        ),
    )
    async def set_quota(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
        data: JSONBody[QuotaLimits],
    ) -> dict[str, Any]:
        """Set the user's token quotas (audited); the next reply they start is held to them."""
        done = await overrides.set_limits(
            sessions, actor(request, user), user_id, data.per_day, data.per_month
        )
        return {**account_json(done), **quota_json(done)}

    @post(
        "/users/{user_id:uuid}/logout",
        status_code=200,
        raises=documented(NotAuthorizedException, PermissionDeniedException, UserNotFoundError),
    )
    async def logout_everywhere(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        user_id: FromPath[UUID],
    ) -> dict[str, Any]:
        done = await management.end_sessions(sessions, actor(request, user), user_id)
        changed(request, user_id)
        sign_outs.sign_out(user_id, "logged_out")  # their sockets and replies end at once
        return account_json(done)

    @post(
        "/users/{user_id:uuid}/reset-link",
        status_code=HTTP_201_CREATED,
        raises=documented(NotAuthorizedException, PermissionDeniedException, UserNotFoundError),
    )
    async def reset_link(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        user_id: FromPath[UUID],
    ) -> dict[str, Any]:
        """A one-time password-reset link to hand over; the secret is never available again."""
        target, secret = await links.create_reset_link(sessions, actor(request, user), user_id)
        return {"user_id": str(target.id), "path": f"/reset#token={secret}"}

    @delete(
        "/users/{user_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            UserNotFoundError,
            LastAdminError,
            WrongStateError,
        ),
    )
    async def delete_user(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        user_id: FromPath[UUID],
    ) -> None:
        await management.delete_user(sessions, actor(request, user), user_id)
        changed(request, user_id)
        sign_outs.sign_out(user_id, "deleted")  # their sockets and replies end at once

    @post(
        "/invitations",
        status_code=HTTP_201_CREATED,
        raises=documented(NotAuthorizedException, PermissionDeniedException, RequestEntityTooLarge),
    )
    async def invite(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        data: JSONBody[NewInvitation],
    ) -> dict[str, Any]:
        """A single-use invitation link (SIGNUP_MODE=invite), optionally for one email."""
        token, secret = await links.create_invite(sessions, actor(request, user), data.email)
        return {
            "path": f"/signup#invite={secret}",
            "email": token.email,
            "expires_at": iso(token.expires_at),
        }

    @get(
        "/audit",
        raises=documented(NotAuthorizedException, PermissionDeniedException, ClientException),
    )
    async def audit_log(
        self,
        sessions: NamedDependency[Sessions],
        action: Annotated[str | None, QueryParameter(max_length=40)] = None,
        who: Annotated[str | None, QueryParameter(max_length=320)] = None,
        page: Annotated[int, QueryParameter(ge=1, le=1_000_000)] = 1,
    ) -> dict[str, Any]:
        """The audit log, newest first; `who` matches the actor's or the target's email or id."""
        filters = audit.AuditFilter(
            action=search_text(action, "action"), user=search_text(who, "who")
        )
        entries, total = await audit.list_entries(
            sessions, filters, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
        )
        return {"entries": [entry_json(e) for e in entries], "total": total, "page": page}
