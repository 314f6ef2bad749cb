"""A reply's folded text (app/streaming/reply_text.py) reads exactly as the plain concatenation."""

from __future__ import annotations

import bisect
import sys

from hypothesis import given
from hypothesis import strategies as st

from app.streaming.reply_text import FOLD, ReplyText

pieces = st.lists(st.text(max_size=6), max_size=3 * FOLD + 5)


@given(pieces, st.data())
def test_reads_as_the_concatenation_from_any_offset(parts: list[str], data: st.DataObject) -> None:
    text = ReplyText()
    for part in parts:
        text.append(part)
    whole = "".join(parts)
    assert str(text) == whole and text.length == len(whole)
    for offset in {0, len(whole), len(whole) + 3, data.draw(st.integers(0, len(whole)))}:
        assert text.since(offset) == whole[offset:]


@given(pieces, st.data())
def test_counts_pieces_between_boundaries_as_a_list_of_ends_would(
    parts: list[str], data: st.DataObject
) -> None:
    text = ReplyText()
    ends: list[int] = []
    for part in parts:
        text.append(part)
        ends.append(text.length)
    start = data.draw(st.integers(0, text.length))
    end = data.draw(st.integers(start, text.length))
    expected = bisect.bisect_left(ends, end) - bisect.bisect_right(ends, start) + 1
    assert text.pieces_between(start, end) == expected


def test_a_long_reply_costs_its_characters_and_a_few_bytes_a_piece() -> None:
    text = ReplyText()
    for i in range(10_000):
        text.append(f"tok{i % 10} ")
    held = sum(sys.getsizeof(chunk) for chunk in text._chunks) + sys.getsizeof(text.piece_ends)
    assert held < 10_000 * (5 + 12)  # 5 characters and ~8 bytes of offset a piece, not ~300
