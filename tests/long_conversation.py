"""A long conversation to import (the version-1 export: one line of messages), for the tests of
paging and of opening a huge conversation: questions and Markdown replies with code blocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

START = datetime(2025, 1, 1, tzinfo=UTC)


def reply_text(n: int) -> str:
    return (
        f"Answer **{n}**: here is a list and some code.\n\n"
        f"- first point about item {n}\n- second point, with `inline code`\n\n"
        f"```python\ndef answer_{n}(x):\n    return x * {n}  # times {n}\n```\n\n"
        f"That is all for question {n}."
    )


def long_export(messages: int, title: str = "A long conversation") -> dict[str, Any]:
    """`messages` messages (question, reply, question...), each a minute after the last."""
    rows = []
    for n in range(messages):
        question = n % 2 == 0
        rows.append(
            {
                "role": "user" if question else "assistant",
                "content": f"Question {n // 2}: how about {n}?" if question else reply_text(n // 2),
                "status": "completed",
                "created_at": (START + timedelta(minutes=n)).isoformat(),
            }
        )
    at = START.isoformat()
    return {
        "format": "streamchat.conversation",
        "version": 1,
        "exported_at": at,
        "conversation": {"title": title, "source": "page", "created_at": at, "updated_at": at},
        "messages": rows,
    }
