"""What the web layer hands the handlers through Litestar's dependency injection (`Provide`).

The lifespan puts the app's `Services` in `app.state`; each provider here takes one piece of it,
so a domain handler names what it needs (`replies: ReplyService`, `sessions: Sessions`,
`settings: Settings`, ...) and never reaches into the app's state itself. The providers name
`services` as a dependency explicitly (`NamedDependency`): Litestar 2.23+ warns about inferred ones
(litestar/_kwargs/kwargs_model.py), and 3.0 drops them.
"""

from __future__ import annotations

from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from app.db.session import Sessions
from app.db.storage import StorageHealth
from app.domain.accounts.ratelimit import AuthLimits
from app.domain.chat.conversation_service import ConversationService
from app.domain.chat.push_events import UserPush
from app.domain.chat.replies import ReplyService
from app.domain.chat.sign_outs import SignOuts
from app.domain.quotas.service import Quotas
from app.engine import Engine
from app.settings import Settings
from app.web.services import Services


def provide_services(state: State) -> Services:
    return state.services


def provide_settings(services: NamedDependency[Services]) -> Settings:
    return services.settings


def provide_sessions(services: NamedDependency[Services]) -> Sessions:
    return services.sessions


def provide_replies(services: NamedDependency[Services]) -> ReplyService:
    return services.replies


def provide_quotas(services: NamedDependency[Services]) -> Quotas:
    return services.quotas


def provide_conversation_service(services: NamedDependency[Services]) -> ConversationService:
    return services.conversations


def provide_push(services: NamedDependency[Services]) -> UserPush:
    return services.push


def provide_sign_outs(services: NamedDependency[Services]) -> SignOuts:
    return services.sign_outs


def provide_engine(services: NamedDependency[Services]) -> Engine:
    return services.engine


def provide_storage(services: NamedDependency[Services]) -> StorageHealth:
    return services.storage


def provide_auth_limits(state: State) -> AuthLimits:
    return state.auth_limits


def app_dependencies() -> dict[str, Provide]:
    return {
        name: Provide(provider, sync_to_thread=False)
        for name, provider in {
            "services": provide_services,
            "settings": provide_settings,
            "sessions": provide_sessions,
            "replies": provide_replies,
            "quotas": provide_quotas,
            "conversation_service": provide_conversation_service,
            "push": provide_push,
            "sign_outs": provide_sign_outs,
            "engine": provide_engine,
            "auth_limits": provide_auth_limits,
            "storage": provide_storage,
        }.items()
    }
