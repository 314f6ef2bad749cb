"""The account API (`/api/account`): the user's own password, sessions, export and import of all
their conversations, who of the admins looked at them, and deleting the account. Cookie-
authenticated like the rest of the page API, so every write carries the CSRF header; everything
is scoped to the logged-in user (another user's session id answers 404). Each route's `raises=`,
for the OpenAPI document: 401 (the `logged_in` guard, `user`'s `provide_user`), 403 for the writes
(Litestar's CSRF check), then the route's own refusals (and a body's 413, the database's 503:
app/domain/refusals.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.exceptions import (
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.session import Sessions
from app.domain.accounts import browser_sessions, management
from app.domain.accounts.access import AccessCache
from app.domain.accounts.authentication import ACCESS_STATE_KEY, LIVE_SESSIONS_STATE_KEY
from app.domain.accounts.browser_sessions import LiveSessions
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.login import EPOCH_KEY, client_address, logout, rotate, session_row
from app.domain.accounts.models import BrowserSession, User
from app.domain.accounts.passwords import WeakPasswordError
from app.domain.accounts.ratelimit import AuthLimits, TooManyAttemptsError
from app.domain.accounts.user_agents import browser_name
from app.domain.chat.conversations.service import ConversationService
from app.domain.chat.keep import export, importing
from app.domain.chat.keep.schemas import ACCOUNT_EXPORT_RESPONSE, MAX_ACCOUNT_IMPORT_BYTES
from app.domain.chat.schemas import ConversationResponse
from app.domain.chat.sign_outs import SignOuts
from app.domain.my_account import service
from app.domain.my_account.schemas import (
    LookResponse,
    PasswordChange,
    PasswordConfirmation,
    SessionResponse,
    SessionsEnded,
)
from app.domain.refusals import TOO_MANY_ATTEMPTS_RESPONSE, documented

T = TypeVar("T")


def session_response(row: BrowserSession, current: UUID | None) -> SessionResponse:
    return SessionResponse(
        id=str(row.id),
        browser=browser_name(row.user_agent),
        user_agent=row.user_agent,
        address=row.address,
        created_at=row.created_at.isoformat(),
        last_seen_at=row.last_seen_at.isoformat(),
        current=row.id == current,
    )


async def _password_checked(
    request: Request, limits: AuthLimits, user: User, check: Callable[[], Awaitable[T]]
) -> T:
    """Run `check` (which verifies the user's password first) under the log-in limits: a stolen
    session must not be a way to guess the password. The attempts count per address and per
    account page (never against the account's log-in from elsewhere); only a wrong password
    keeps its slot."""
    attempt = await limits.start_login(client_address(request), user.email, f"account:{user.id}")
    try:
        result = await check()
    except service.WrongPasswordError:
        raise
    except BaseException:
        await attempt.refund()
        raise
    await attempt.refund()
    return result


def _keep_this_session(request: Request, epoch: int) -> None:
    """The session goes on under the account's new epoch (the others end with the old one)."""
    request.set_session({**request.session, EPOCH_KEY: epoch})
    access: AccessCache = request.app.state[ACCESS_STATE_KEY]
    access.forget(request.user)


class AccountApi(Controller):
    path = "/api/account"
    tags = ["account"]
    guards = [logged_in]
    dependencies = {"user": Provide(provide_user)}

    @get("/sessions", raises=documented(NotAuthorizedException))
    async def list_sessions(
        self, request: Request, sessions: NamedDependency[Sessions], user: NamedDependency[User]
    ) -> list[SessionResponse]:
        """The browsers logged in to this account (this one marked `current`)."""
        rows = await browser_sessions.list_live(sessions, user)
        current = session_row(request)
        return [session_response(row, current) for row in rows]

    @delete(
        "/sessions/{session_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundException),
    )
    async def end_session(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        session_id: FromPath[UUID],
    ) -> None:
        """Log that browser out: its next request finds itself logged out (on any replica), and
        its open sockets and push channels close at once."""
        if not await browser_sessions.end(sessions, user.id, session_id):
            raise NotFoundException("no such session")
        live: LiveSessions = request.app.state[LIVE_SESSIONS_STATE_KEY]
        live.forget(session_id)
        sign_outs.end_sessions(user.id, only=session_id)
        if session_id == session_row(request):
            logout(request)

    @post(
        "/sessions/end-others",
        status_code=200,
        raises=documented(NotAuthorizedException, PermissionDeniedException),
    )
    async def end_other_sessions(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
    ) -> SessionsEnded:
        """Log out every other browser (their sockets close at once); this one stays logged in."""
        listed = await browser_sessions.list_live(sessions, user)
        current = session_row(request)
        epoch = await browser_sessions.end_others(sessions, user.id, current)
        if epoch is None:
            raise NotAuthorizedException("log in first")
        _keep_this_session(request, epoch)
        sign_outs.end_sessions(user.id, keep=current, epoch=epoch)
        return SessionsEnded(ended=len([row for row in listed if row.id != current]))

    @post(
        "/password",
        status_code=HTTP_204_NO_CONTENT,
        responses=TOO_MANY_ATTEMPTS_RESPONSE,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            TooManyAttemptsError,
            service.WrongPasswordError,
            WeakPasswordError,
            management.UserNotFoundError,  # deleted meanwhile
            RequestEntityTooLarge,
        ),
    )
    async def change_password(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        auth_limits: NamedDependency[AuthLimits],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        data: JSONBody[PasswordChange],
    ) -> None:
        """Set a new password (the current one required; a wrong one answers 403). Every other
        session ends (its sockets close at once); this one stays, under a new id. API keys keep
        working."""
        current = session_row(request)
        epoch = await _password_checked(
            request,
            auth_limits,
            user,
            lambda: service.change_password(
                sessions, user, data.current_password, data.new_password, current
            ),
        )
        _keep_this_session(request, epoch)
        sign_outs.end_sessions(user.id, keep=current, epoch=epoch)
        rotate(request)

    @get("/export", responses=ACCOUNT_EXPORT_RESPONSE, raises=documented(NotAuthorizedException))
    async def export_all(
        self, sessions: NamedDependency[Sessions], user: NamedDependency[User]
    ) -> Response[bytes]:
        """Every conversation of the user's in one JSON file (`format`
        "streamchat.conversations": a list of one-conversation exports, each as
        /api/conversations/{id}/export writes it). POST /api/account/import reads it back."""
        file = export.render_account(await export.all_conversation_rows(sessions, user.id))
        return Response(file.body, media_type=file.media_type, headers=file.headers)

    @post(
        "/import",
        status_code=HTTP_201_CREATED,
        # the body is read raw: its 400 is the import's own (not an export), not Litestar's
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            importing.ImportRefusedError,
            RequestEntityTooLarge,
        ),
        request_max_body_size=MAX_ACCOUNT_IMPORT_BYTES,
    )
    async def import_all(
        self,
        request: Request,
        conversation_service: NamedDependency[ConversationService],
        user: NamedDependency[User],
    ) -> list[ConversationResponse]:
        """An account export (or a one-conversation export), read back strictly and checked
        whole before anything is written: each conversation becomes a new one of the user's."""
        body = await request.body()
        if importing.format_of(body) == "streamchat.conversation":
            exports = [importing.decode_export(body)]
        else:
            exports = importing.decode_account_export(body)
        return [
            ConversationResponse.of(await conversation_service.import_export(user.id, e))
            for e in exports
        ]

    @get("/views", raises=documented(NotAuthorizedException))
    async def looks(
        self, sessions: NamedDependency[Sessions], user: NamedDependency[User]
    ) -> list[LookResponse]:
        """Which admin opened or exported which of the user's conversations, and when (the
        audit log; newest first, the last 200)."""
        return [
            LookResponse(
                at=look.at.isoformat(),
                action=look.action,
                admin_id=str(look.admin_id) if look.admin_id else None,
                admin_email=look.admin_email,
                conversation_id=str(look.conversation_id) if look.conversation_id else None,
                conversation_title=look.conversation_title,
            )
            for look in await service.looks_at(sessions, user.id)
        ]

    @post(
        "/delete",
        status_code=HTTP_204_NO_CONTENT,
        responses=TOO_MANY_ATTEMPTS_RESPONSE,
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            TooManyAttemptsError,
            service.WrongPasswordError,
            management.UserNotFoundError,  # deleted meanwhile
            management.LastAdminError,
            management.WrongStateError,
            RequestEntityTooLarge,
        ),
    )
    async def delete_account(
        self,
        request: Request,
        sessions: NamedDependency[Sessions],
        auth_limits: NamedDependency[AuthLimits],
        user: NamedDependency[User],
        sign_outs: NamedDependency[SignOuts],
        data: JSONBody[PasswordConfirmation],
    ) -> None:
        """Delete the account (the password again) with everything of the user's: conversations,
        ratings, API keys, sessions; their running replies stop and their sockets close at once,
        on every replica. The audit log keeps its entries, by the user's id. The last active
        admin cannot delete themselves (409)."""
        address = client_address(request)
        await _password_checked(
            request,
            auth_limits,
            user,
            lambda: service.delete_account(sessions, user, data.password, address),
        )
        access: AccessCache = request.app.state[ACCESS_STATE_KEY]
        access.forget(user.id)
        sign_outs.sign_out(user.id, "deleted")
        logout(request)
