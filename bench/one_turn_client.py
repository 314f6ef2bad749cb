"""A chat client that fits its history to the context by dropping as few of the oldest turns as it
must on every send: the window bench/long_conversation.py measures the app's stepped window
against (its start moves on almost every send once the history overflows). Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def split_turns(history: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The history in turns: each starts at a user message (or at the very first message)."""
    turns: list[list[dict[str, Any]]] = []
    for message in history:
        if message["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def one_turn_start(sizes: Sequence[int], room: int) -> int:
    """The first turn a client keeps when it drops as few of the oldest turns as it must: the
    smallest start from which the turns (token counts, oldest first) fit in `room`."""
    total = sum(sizes)
    for start, size in enumerate(sizes):
        if total <= room:
            return start
        total -= size
    return len(sizes)


def one_turn_messages(
    history: Sequence[dict[str, Any]], asked: dict[str, Any], room: int, system: str
) -> tuple[list[dict[str, str]], int]:
    """The messages for `asked` after `history` (messages with role, content, token_count), the
    newest whole turns that fit with the question in `room` (the conversation's
    max_message_tokens), and the index of the first turn kept."""
    turns = split_turns(history)
    sizes = [sum(m["token_count"] for m in turn) for turn in turns]
    start = one_turn_start(sizes, room - asked["token_count"])
    kept = [m for turn in turns[start:] for m in turn]
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": m["role"], "content": m["content"]} for m in kept]
    messages.append({"role": "user", "content": asked["content"]})
    return messages, start
