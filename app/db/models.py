"""Every model, imported in one place so that `Base.metadata` holds the whole schema.

Alembic's env.py and the tests import this module; application code imports models from their
domain packages.
"""

from app.db.base import Base
from app.domain.accounts.models import ApiKey, User
from app.domain.chat.models import Conversation, Message

__all__ = ("ApiKey", "Base", "Conversation", "Message", "User")
