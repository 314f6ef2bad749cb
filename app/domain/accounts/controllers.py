"""The account API: sign-up, log-in, log-out, password reset by link, who am I, and API keys
for `/v1`.

Each route's `raises=`, for the OpenAPI document: 403 for every write (Litestar's CSRF check: the
log-in and sign-up forms carry the token too), 401 for the routes behind `logged_in`, then the
route's own refusals (and a body's 413, the database's 503: app/domain/refusals.py).
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import msgspec
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
from app.domain.accounts import links
from app.domain.accounts import service as accounts
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.login import (
    client_address,
    device_cookie,
    end_listed,
    known_device,
    log_in,
    logout,
)
from app.domain.accounts.models import ApiKey, User, UserState
from app.domain.accounts.passwords import WeakPasswordError
from app.domain.accounts.ratelimit import AuthLimits, TooManyAttemptsError
from app.domain.chat.sign_outs import SignOuts
from app.domain.refusals import TOO_MANY_ATTEMPTS_RESPONSE, documented
from app.settings import Settings


class Credentials(msgspec.Struct, forbid_unknown_fields=True):
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class SignUp(Credentials, forbid_unknown_fields=True):
    invite: Annotated[str, msgspec.Meta(max_length=100)] | None = None  # SIGNUP_MODE=invite


class PasswordReset(msgspec.Struct, forbid_unknown_fields=True):
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class NewKey(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] = "API key"


def user_json(user: User) -> dict[str, object]:
    return {
        "id": str(user.id),
        "email": user.email,
        "is_admin": user.is_admin,
        "state": str(user.state),
    }


async def _sign_up(sessions: Sessions, mode: str, data: SignUp) -> User:
    """A new account as SIGNUP_MODE says (the first account of the instance is its admin in
    every mode: app/domain/accounts/service.py)."""
    if mode == "closed":
        return await accounts.create_user(sessions, data.email, data.password, only_first=True)
    if mode == "invite":
        invite = data.invite or ""
        return await accounts.create_user(sessions, data.email, data.password, invite=invite)
    state = UserState.PENDING if mode == "approval" else UserState.ACTIVE
    return await accounts.create_user(sessions, data.email, data.password, state=state)


def key_json(key: ApiKey) -> dict[str, object]:
    return {
        "id": str(key.id),
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


class AuthController(Controller):
    path = "/api"
    tags = ["accounts"]

    @post(
        "/auth/signup",
        status_code=HTTP_201_CREATED,
        responses=TOO_MANY_ATTEMPTS_RESPONSE,
        raises=documented(
            PermissionDeniedException,
            TooManyAttemptsError,
            accounts.InvalidEmailError,
            WeakPasswordError,
            links.InvalidLinkError,  # SIGNUP_MODE=invite: no such invitation, or a spent one
            accounts.SignupClosedError,
            accounts.EmailTakenError,
            RequestEntityTooLarge,
        ),
    )
    async def signup(
        self,
        request: Request,
        data: JSONBody[SignUp],
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        auth_limits: NamedDependency[AuthLimits],
    ) -> Response[dict[str, object]]:
        """Sign up and log in (under SIGNUP_MODE=approval, to the page that waits for an admin:
        `state` is "pending"). An email that is taken answers 409: without a mail round trip,
        a sign-up that logs in at once cannot hide whether the address was free (README,
        "Security"), so sign-ups are limited per address like log-ins instead."""
        # Refusals (a limit reached: 429; a taken email: 409; a weak password or a spent
        # invitation: 400; sign-up closed: 403) are answered by the app's exception map
        # (app/domain/refusals.py).
        await auth_limits.start_signup(client_address(request))
        user = await _sign_up(sessions, settings.signup_mode, data)
        await log_in(request, sessions, user)
        return Response(
            user_json(user),
            status_code=HTTP_201_CREATED,
            cookies=[device_cookie(request, settings.secret_key, user.email)],
        )

    @post(
        "/auth/login",
        status_code=200,
        responses=TOO_MANY_ATTEMPTS_RESPONSE,
        # 401: a wrong email or password; 403: a disabled account (or CSRF)
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            TooManyAttemptsError,
            RequestEntityTooLarge,
        ),
    )
    async def login(
        self,
        request: Request,
        data: JSONBody[Credentials],
        sessions: NamedDependency[Sessions],
        settings: NamedDependency[Settings],
        auth_limits: NamedDependency[AuthLimits],
    ) -> Response[dict[str, object]]:
        email = accounts.normalize_email(data.email)
        # Reserved before the (slow) password check: attempts in flight count too. A limit
        # reached is a 429 with Retry-After (the app's exception map, app/domain/refusals.py).
        attempt = await auth_limits.start_login(
            client_address(request), email, known_device(request, settings.secret_key, email)
        )
        user = await accounts.authenticate(sessions, email, data.password)
        if user is None:
            raise NotAuthorizedException("wrong email or password")
        await attempt.refund()
        if user.state == UserState.DISABLED:  # said only to who knows the password
            raise PermissionDeniedException("this account is disabled: ask an admin")
        await log_in(request, sessions, user)
        return Response(
            user_json(user), cookies=[device_cookie(request, settings.secret_key, email)]
        )

    @post(
        "/auth/reset",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(
            PermissionDeniedException,
            links.InvalidLinkError,
            WeakPasswordError,
            RequestEntityTooLarge,
        ),
    )
    async def reset_password(
        self,
        data: JSONBody[PasswordReset],
        sessions: NamedDependency[Sessions],
        sign_outs: NamedDependency[SignOuts],
    ) -> None:
        """Set a new password with a one-time link an admin made; the user then logs in. Every
        session of theirs ends and their API keys are revoked (app/domain/accounts/links.py);
        their open sockets and running replies end at once (app/domain/chat/sign_outs.py)."""
        user = await links.reset_password(sessions, data.token, data.password)
        sign_outs.sign_out(user.id, "password_reset")

    @post(
        "/auth/logout",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(PermissionDeniedException),
    )
    async def logout(self, request: Request, sessions: NamedDependency[Sessions]) -> None:
        await end_listed(request, sessions)  # off the list of the user's sessions
        logout(request)

    @get(
        "/me",
        guards=[logged_in],
        dependencies={"user": Provide(provide_user)},
        raises=documented(NotAuthorizedException),
    )
    async def me(self, user: NamedDependency[User]) -> dict[str, object]:
        return user_json(user)


class ApiKeyController(Controller):
    path = "/api/keys"
    tags = ["accounts"]
    guards = [logged_in]
    dependencies = {"user": Provide(provide_user)}

    @get("/", raises=documented(NotAuthorizedException))
    async def list_keys(
        self, sessions: NamedDependency[Sessions], user: NamedDependency[User]
    ) -> list[dict[str, object]]:
        keys = await accounts.list_api_keys(sessions, user.id)
        return [key_json(k) for k in keys]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        raises=documented(NotAuthorizedException, PermissionDeniedException, RequestEntityTooLarge),
    )
    async def create_key(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        data: JSONBody[NewKey],
    ) -> dict[str, object]:
        key, secret = await accounts.create_api_key(
            sessions, user.id, data.name.strip() or "API key"
        )
        return {**key_json(key), "secret": secret}  # the only time the secret is ever shown

    @delete(
        "/{key_id:uuid}",
        status_code=HTTP_204_NO_CONTENT,
        raises=documented(NotAuthorizedException, PermissionDeniedException, NotFoundException),
    )
    async def revoke_key(
        self,
        sessions: NamedDependency[Sessions],
        user: NamedDependency[User],
        key_id: FromPath[UUID],
    ) -> None:
        if not await accounts.revoke_api_key(sessions, user.id, key_id):
            raise NotFoundException("no such API key")


__all__ = ["ApiKeyController", "AuthController"]
