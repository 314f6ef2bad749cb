"""The settings panel's API: a conversation's settings, and the user's defaults for new ones.

    GET/PUT /api/conversations/{id}/settings     (another user's id answers 404)
    GET/PUT /api/account/chat-defaults

Routes only translate (app/domain/chat/settings/service.py does the work); a value out of range is
refused as a reply request's would be (400, through the app's exception map). Each route's
`raises=`, for the OpenAPI document: 401 (the router's `logged_in` guard, `user`'s `provide_user`),
403 for the writes (Litestar's CSRF check), then the route's own refusals (and a body's 413, the
database's 503: app/domain/refusals.py).
"""

from __future__ import annotations

from uuid import UUID

from litestar import Controller, Router, get, put
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.params import FromPath, JSONBody

from app.db.session import Sessions
from app.domain.accounts.dependencies import provide_user
from app.domain.accounts.guards import logged_in
from app.domain.accounts.models import User
from app.domain.chat.conversations.store import ConversationNotFoundError
from app.domain.chat.replies.service import ReplyService
from app.domain.chat.settings import service as chat_settings
from app.domain.chat.settings.schemas import ChatSettings, SettingsView
from app.domain.errors import InvalidInputError
from app.domain.refusals import documented


class SettingsController(Controller):
    @get(
        "/conversations/{conversation_id:uuid}/settings",
        raises=documented(NotAuthorizedException, ConversationNotFoundError),
    )
    async def conversation_settings(
        self,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
    ) -> SettingsView:
        chosen = await chat_settings.for_users_conversation(
            replies.sessions, user.id, conversation_id
        )
        return chat_settings.view(chosen, replies.limits)

    @put(
        "/conversations/{conversation_id:uuid}/settings",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            InvalidInputError,
            ConversationNotFoundError,
            RequestEntityTooLarge,
        ),
    )
    async def save_conversation_settings(
        self,
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        conversation_id: FromPath[UUID],
        data: JSONBody[ChatSettings],
    ) -> SettingsView:
        """Used from the conversation's next turn on, send and regenerate alike."""
        context_size = replies.manager.engine.context_size
        chosen = chat_settings.checked(data, replies.limits, context_size)
        await chat_settings.save_for_conversation(
            replies.sessions, user.id, conversation_id, chosen
        )
        return chat_settings.view(chosen, replies.limits)

    @get("/account/chat-defaults", raises=documented(NotAuthorizedException))
    async def defaults(
        self,
        sessions: NamedDependency[Sessions],
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
    ) -> SettingsView:
        chosen = await chat_settings.user_defaults(sessions, user.id)
        return chat_settings.view(chosen, replies.limits)

    @put(
        "/account/chat-defaults",
        raises=documented(
            NotAuthorizedException,
            PermissionDeniedException,
            InvalidInputError,
            RequestEntityTooLarge,
        ),
    )
    async def save_defaults(
        self,
        sessions: NamedDependency[Sessions],
        replies: NamedDependency[ReplyService],
        user: NamedDependency[User],
        data: JSONBody[ChatSettings],
    ) -> SettingsView:
        """What the user's new conversations start from (existing ones keep their own)."""
        context_size = replies.manager.engine.context_size
        chosen = chat_settings.checked(data, replies.limits, context_size)
        await chat_settings.save_user_defaults(sessions, user.id, chosen)
        return chat_settings.view(chosen, replies.limits)


settings_router = Router(
    "/api",
    route_handlers=[SettingsController],
    guards=[logged_in],
    dependencies={"user": Provide(provide_user)},
    tags=["settings"],
)
