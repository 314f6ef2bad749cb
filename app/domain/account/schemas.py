"""What the account API reads and answers, as msgspec structs."""

from __future__ import annotations

from typing import Annotated

import msgspec


class PasswordChange(msgspec.Struct, forbid_unknown_fields=True):
    current_password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    new_password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class PasswordConfirmation(msgspec.Struct, forbid_unknown_fields=True):
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class SessionResponse(msgspec.Struct):
    """One logged-in browser of the user's."""

    id: str
    browser: str  # "Firefox on Linux", from the User-Agent header
    user_agent: str
    address: str
    created_at: str
    last_seen_at: str
    current: bool  # the session this request came in


class SessionsEnded(msgspec.Struct):
    ended: int  # how many sessions were listed besides this one


class LookResponse(msgspec.Struct):
    """An admin opened (view_conversation) or exported (export_conversation) a conversation."""

    at: str
    action: str
    admin_id: str | None
    admin_email: str
    conversation_id: str | None
    conversation_title: str | None  # null: the conversation is gone since
