"""The account API: sign-up, log-in, log-out, who am I, and API keys for `/v1`."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import Provide
from litestar.exceptions import ClientException, NotAuthorizedException, NotFoundException
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT, HTTP_429_TOO_MANY_REQUESTS

from app.domain.accounts import passwords
from app.domain.accounts import service as accounts
from app.domain.accounts.models import ApiKey, User
from app.web.auth import current_user, login, logout, services_of


class Credentials(msgspec.Struct, forbid_unknown_fields=True):
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class NewKey(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] = "API key"


def user_json(user: User) -> dict[str, object]:
    return {"id": str(user.id), "email": user.email, "is_admin": user.is_admin}


def key_json(key: ApiKey) -> dict[str, object]:
    return {
        "id": str(key.id),
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class AuthController(Controller):
    path = "/api"
    tags = ["accounts"]

    @post("/auth/signup", status_code=HTTP_201_CREATED)
    async def signup(self, request: Request, data: Credentials) -> dict[str, object]:
        sessions = services_of(request).sessions
        try:
            user = await accounts.create_user(sessions, data.email, data.password)
        except accounts.EmailTakenError as exc:
            raise ClientException(
                "an account with this email already exists", status_code=409
            ) from exc
        except (passwords.WeakPasswordError, ValueError) as exc:
            raise ClientException(str(exc)) from exc
        login(request, user)
        return user_json(user)

    @post("/auth/login", status_code=200)
    async def login(self, request: Request, data: Credentials) -> Response[dict[str, object]]:
        limiter = request.app.state.login_limiter
        address, email = _client_address(request), accounts.normalize_email(data.email)
        wait = limiter.retry_after(address, email)
        if wait > 0:
            return Response(
                {"detail": "too many failed log-ins: try again shortly"},
                status_code=HTTP_429_TOO_MANY_REQUESTS,
                headers={"Retry-After": str(int(wait) + 1)},
            )
        user = await accounts.authenticate(services_of(request).sessions, email, data.password)
        if user is None:
            limiter.failed(address, email)
            raise NotAuthorizedException("wrong email or password")
        limiter.succeeded(email)
        login(request, user)
        return Response(user_json(user))

    @post("/auth/logout", status_code=HTTP_204_NO_CONTENT)
    async def logout(self, request: Request) -> None:
        logout(request)

    @get("/me", dependencies={"user": Provide(current_user)})
    async def me(self, user: User) -> dict[str, object]:
        return user_json(user)


class ApiKeyController(Controller):
    path = "/api/keys"
    tags = ["accounts"]
    dependencies = {"user": Provide(current_user)}

    @get("/")
    async def list_keys(self, request: Request, user: User) -> list[dict[str, object]]:
        keys = await accounts.list_api_keys(services_of(request).sessions, user.id)
        return [key_json(k) for k in keys]

    @post("/", status_code=HTTP_201_CREATED)
    async def create_key(self, request: Request, user: User, data: NewKey) -> dict[str, object]:
        key, secret = await accounts.create_api_key(
            services_of(request).sessions, user.id, data.name.strip() or "API key"
        )
        return {**key_json(key), "secret": secret}  # the only time the secret is ever shown

    @delete("/{key_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def revoke_key(self, request: Request, user: User, key_id: UUID) -> None:
        if not await accounts.revoke_api_key(services_of(request).sessions, user.id, key_id):
            raise NotFoundException("no such API key")


__all__ = ["ApiKeyController", "AuthController"]
