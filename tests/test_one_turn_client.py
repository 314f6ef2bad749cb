"""bench/one_turn_client.py: the window bench/long_conversation.py measures the stepped one
against, a client that drops as few of the oldest turns as it must on every send."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

from one_turn_client import one_turn_messages, one_turn_start, split_turns

from app.domain.chat.prompts.window import window_start


def said(role: str, content: str, tokens: int) -> dict[str, object]:
    return {"role": role, "content": content, "token_count": tokens}


def test_keeps_everything_that_fits_and_drops_the_oldest_turns_first() -> None:
    assert one_turn_start([100, 100, 100], 300) == 0
    assert one_turn_start([100, 100, 100], 299) == 1
    assert one_turn_start([100, 100, 100], 100) == 2
    assert one_turn_start([100, 100, 100], 99) == 3  # no history at all
    assert one_turn_start([], 0) == 0


def test_is_the_smallest_start_that_fits() -> None:
    rng = random.Random(7)
    for _ in range(500):
        sizes = [rng.randint(1, 300) for _ in range(rng.randint(0, 12))]
        room = rng.randint(0, 1500)
        start = one_turn_start(sizes, room)
        assert sum(sizes[start:]) <= room
        assert start == 0 or sum(sizes[start - 1 :]) > room
        # the app's stepped window, from the same start, keeps it while it fits; moved from the
        # start of the conversation it never keeps more than the one-turn client
        assert window_start(sizes, room, start) == start
        assert window_start(sizes, room, 0) >= start


def test_moves_its_start_on_every_send_once_the_history_overflows() -> None:
    sizes, starts = [], []
    for _ in range(12):
        sizes.append(250)
        starts.append(one_turn_start(sizes, 1000))
    assert starts == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_messages_are_the_system_prompt_the_newest_whole_turns_and_the_question() -> None:
    history = [
        said("user", "q1", 10),
        said("assistant", "a1", 50),
        said("user", "q2", 10),
        said("assistant", "a2", 40),
        said("assistant", "a2 again", 5),  # a turn may hold more than one reply
        said("user", "q3", 10),
        said("assistant", "a3", 30),
    ]
    assert [len(t) for t in split_turns(history)] == [2, 3, 2]
    asked = said("user", "q4", 20)
    messages, start = one_turn_messages(history, asked, 20 + 55 + 40, "be brief")
    assert start == 1
    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "assistant", "content": "a2 again"},
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "q4"},
    ]
    messages, start = one_turn_messages(history, asked, 20, "")
    assert (messages, start) == ([{"role": "user", "content": "q4"}], 3)
