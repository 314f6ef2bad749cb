"""The context window's fitting and stepping (app/domain/chat/prompts/window.py): pure functions,
checked on examples and, with hypothesis, on whole simulated conversations."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.chat.prompts.window import (
    MessageTooLongError,
    Room,
    Said,
    fit,
    window_start,
)


def suffix(turns: list[int], start: int) -> int:
    return sum(turns[start:])


def test_keeps_the_previous_start_while_it_fits() -> None:
    assert window_start([10, 10, 10], room=100, previous=0) == 0
    assert window_start([10, 10, 10], room=100, previous=2) == 2  # never moves back


def test_moves_down_to_half_the_room_when_it_must() -> None:
    # 10 turns of 10: 100 > room 60: the start moves until at most 30 are left
    assert window_start([10] * 10, room=60, previous=0) == 7


def test_keeps_the_newest_turn_when_it_alone_takes_more_than_half() -> None:
    assert window_start([10, 50], room=55, previous=0) == 1
    assert window_start([10, 70], room=60, previous=0) == 2  # nothing fits: only the question


@given(
    turns=st.lists(st.integers(1, 300), max_size=40),
    room=st.integers(0, 2000),
    previous=st.integers(0, 45),
)
def test_the_window_always_fits_and_never_moves_back(
    turns: list[int], room: int, previous: int
) -> None:
    start = window_start(turns, room, previous)
    assert 0 <= start <= len(turns)
    assert suffix(turns, start) <= room
    kept = min(previous, len(turns))
    assert start >= kept
    if suffix(turns, kept) <= room:
        assert start == kept  # fits: the prefix stays
    elif start < len(turns) - 1:
        assert suffix(turns, start) <= room // 2  # moved: far enough for the next turns


@settings(max_examples=200)
@given(turns=st.lists(st.integers(1, 100), min_size=1, max_size=120), room=st.integers(400, 1000))
def test_a_conversation_moves_its_window_in_steps(turns: list[int], room: int) -> None:
    """Turn by turn, as the service does: the start moves rarely, and between two moves at
    least half the room's worth of new turns came (each turn is at most a quarter of it)."""
    start, moves, added_since = 0, 0, 0
    for n in range(1, len(turns) + 1):
        history = turns[:n]
        new = window_start(history, room, start)
        assert sum(history[new:]) <= room
        if new != start:
            if moves:
                assert added_since > room - room // 2 - 100
            moves, added_since = moves + 1, 0
        added_since += turns[n - 1]
        start = new
    assert moves <= sum(turns) // (room // 2 - 100) + 1


def words(n: int) -> str:
    return " ".join(["w"] * n)


def count(message: dict[str, str]) -> int:  # one token per word, plus 2 of framing
    return len(message["content"].split()) + 2


def said(role: str, n: int, tokens: int | None = None) -> Said:
    return Said(uuid4(), role, words(n), tokens)


def conversation(turns: int, size: int) -> list[Said]:
    return [s for _ in range(turns) for s in (said("user", size), said("assistant", size))]


def test_fit_keeps_the_system_prompt_and_the_question_and_drops_whole_turns() -> None:
    history = conversation(10, 8)  # 10 turns of 2 x 10 tokens
    question = said("user", 8)
    room = Room(context=200, reply=50, overhead=5)
    fitted = fit(
        history, question, system_prompt="be brief", room=room, count=count, previous_start=None
    )
    assert fitted.messages[0] == {"role": "system", "content": "be brief"}
    assert fitted.messages[-1] == {"role": "user", "content": question.content}
    window = fitted.messages[1:-1]
    assert window[0]["role"] == "user" and len(window) % 2 == 0  # whole turns
    assert window == [{"role": s.role, "content": s.content} for s in history[-len(window) :]]
    assert fitted.window_start_id == history[-len(window)].id
    assert fitted.prompt_tokens <= room.context - room.reply
    assert fitted.counted == {s.id: 10 for s in history}  # every message counted once
    assert fitted.question_tokens == 10


def test_stored_counts_are_used_not_recounted() -> None:
    history = [said("user", 3, tokens=7), said("assistant", 3, tokens=9)]
    calls: list[str] = []

    def counting(message: dict[str, str]) -> int:
        calls.append(message["content"])
        return count(message)

    question = said("user", 1)
    room = Room(1000, 10, 0)
    fitted = fit(
        history, question, system_prompt="", room=room, count=counting, previous_start=None
    )
    assert calls == [question.content] and fitted.counted == {}
    assert fitted.window_start_id is None  # from the start
    assert fitted.prompt_tokens == 7 + 9 + 3


def test_a_question_that_cannot_fit_alone_is_refused_with_the_limit() -> None:
    room = Room(context=100, reply=50, overhead=10)
    with pytest.raises(MessageTooLongError) as info:
        fit([], said("user", 39), system_prompt="", room=room, count=count, previous_start=None)
    assert (info.value.tokens, info.value.limit, info.value.context) == (41, 40, 100)
    assert "40 tokens" in str(info.value) and info.value.status == 400
    # exactly the limit fits, even after a long history (which then all goes)
    fitted = fit(
        conversation(5, 10), said("user", 38), system_prompt="", room=room, count=count,
        previous_start=None,
    )  # fmt: skip
    assert fitted.messages == [{"role": "user", "content": words(38)}]


def test_no_history_fits_then_the_window_starts_at_the_question() -> None:
    question = said("user", 30)
    room = Room(context=100, reply=50, overhead=10)
    fitted = fit(
        conversation(2, 10), question, system_prompt="", room=room, count=count,
        previous_start=None,
    )  # fmt: skip
    assert fitted.window_start_id == question.id
    # the next turn keeps it: that question is now the first of the window
    history = [*conversation(2, 10), question, said("assistant", 1)]
    nxt = fit(
        history, said("user", 1), system_prompt="", room=room, count=count,
        previous_start=question.id,
    )  # fmt: skip
    assert nxt.window_start_id == question.id


def test_an_unknown_previous_start_counts_as_the_start() -> None:
    history = conversation(3, 1)
    fitted = fit(
        history, said("user", 1), system_prompt="", room=Room(1000, 10, 0), count=count,
        previous_start=UUID(int=1),
    )  # fmt: skip
    assert fitted.window_start_id is None and len(fitted.messages) == 7
