"""How the users page and its API show accounts, usage and audit entries, and read their
search boxes (shared by app/domain/admin/users_api.py and users_pages.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from litestar.exceptions import ClientException

from app.domain.accounts.models import AuditEntry, User, UserState
from app.domain.admin import user_queries
from app.domain.json_input import text_problem

PAGE_SIZE = 50


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def account_json(user: User) -> dict[str, Any]:
    return {
        "id": str(user.id),
        "email": user.email,
        "is_admin": user.is_admin,
        "state": str(user.state),
        "created_at": iso(user.created_at),
    }


def row_json(row: user_queries.UserRow) -> dict[str, Any]:
    usage = row.usage
    return {
        **account_json(row.user),
        "last_seen_at": iso(row.last_seen_at),
        "replies_day": usage.replies_day,
        "tokens_day": usage.tokens_day,
        "replies_month": usage.replies_month,
        "tokens_month": usage.tokens_month,
        **quota_json(row.user),
        "quota_used_day": row.quota_used[0],
        "quota_used_month": row.quota_used[1],
    }


def quota_json(user: User) -> dict[str, Any]:
    """The user's quota overrides: None follows the default, 0 is no limit."""
    return {
        "quota_per_day": user.quota_tokens_per_day,
        "quota_per_month": user.quota_tokens_per_month,
    }


def entry_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": str(entry.id),
        "at": iso(entry.created_at),
        "actor_id": str(entry.actor_id) if entry.actor_id else None,
        "actor_email": entry.actor_email,
        "action": entry.action,
        "target_id": str(entry.target_id) if entry.target_id else None,
        "target_email": entry.target_email,
        "detail": entry.detail,
        "address": entry.address,
    }


def search_text(value: str | None, name: str) -> str | None:
    """A search box's text, stripped; None when empty. NUL and lone surrogates are refused (400):
    PostgreSQL cannot compare with them."""
    if value and (problem := text_problem(value)) is not None:
        raise ClientException(f"{name}: {problem}")
    return value.strip() if value and value.strip() else None


def parse_state(value: str | None) -> UserState | None:
    if not value:
        return None
    try:
        return UserState(value)
    except ValueError as exc:
        raise ClientException(f"unknown state {value!r}") from exc
