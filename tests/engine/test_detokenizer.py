"""The incremental detokenizer against its full re-decode oracle, over random token splits."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.detokenizer import IncrementalDetokenizer, reference_detokenize

# Letters that stress the decoder: 2-, 3- and 4-byte UTF-8, right-to-left scripts, combining marks.
ALPHABET = (
    list("ab \n:Us") + list("éñ漢字かな한글שלוםمرحبا") + ["\u0301", "\u0308", "👍", "🧑‍💻", "🇫🇷"]
)
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)


@st.composite
def tokenised(draw: st.DrawFn) -> tuple[str, list[bytes], list[str]]:
    """A text, its UTF-8 bytes cut at random points (like byte-level BPE tokens), and stop strings."""
    text = draw(texts)
    data = text.encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    bounds = [0, *[c for c in cuts if 0 < c < len(data)], len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    # Stops: substrings of the text (so they do occur, often across token boundaries) or random.
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        if text and draw(st.booleans()):
            i = draw(st.integers(0, len(text) - 1))
            j = draw(st.integers(i + 1, min(len(text), i + 6)))
            stops.append(text[i:j])
        else:
            stops.append("".join(draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=3))))
    return text, pieces, stops


def run_incremental(pieces: list[bytes], stops: list[str]) -> tuple[list[tuple[str, bool]], str]:
    det = IncrementalDetokenizer(stop=stops)
    steps = []
    for piece in pieces:
        text, stopped = det.push(piece)
        steps.append((text, stopped))
        if stopped:
            break
    return steps, det.flush()


@settings(max_examples=400, deadline=None)
@given(tokenised())
def test_incremental_matches_full_redecode_oracle(case: tuple[str, list[bytes], list[str]]) -> None:
    text, pieces, stops = case
    steps, tail = run_incremental(pieces, stops)
    assert steps == reference_detokenize(pieces, stops)

    emitted = "".join(t for t, _ in steps) + tail
    assert "\ufffd" not in emitted  # never a broken character
    if steps and steps[-1][1]:  # stopped: cut exactly where a stop string starts
        assert text.startswith(emitted)
        assert any(text[len(emitted) :].startswith(s) for s in stops)
    else:
        assert emitted == text


@settings(max_examples=200, deadline=None)
@given(tokenised())
def test_no_emitted_prefix_ever_contains_a_stop_string(
    case: tuple[str, list[bytes], list[str]],
) -> None:
    _, pieces, stops = case
    steps, tail = run_incremental(pieces, stops)
    emitted = "".join(t for t, _ in steps) + tail
    assert not any(s in emitted for s in stops)


def test_stop_string_spanning_three_tokens_is_cut_exactly() -> None:
    det = IncrementalDetokenizer(stop=["\n\nUser:"])
    assert det.push(b"Hello") == ("Hello", False)
    assert det.push(b"\n\nU") == ("", False)  # could still become the stop string: held back
    assert det.push(b"se") == ("", False)
    assert det.push(b"r: hi") == ("", True)
    assert det.flush() == ""


def test_false_alarm_releases_held_text() -> None:
    det = IncrementalDetokenizer(stop=["\n\nUser:"])
    assert det.push(b"a\n\nUs") == ("a", False)
    assert det.push(b"ually") == ("\n\nUsually", False)


def test_held_text_is_released_by_flush_at_the_end() -> None:
    det = IncrementalDetokenizer(stop=["STOP"])
    assert det.push(b"go ST") == ("go ", False)
    assert det.flush() == "ST"


def test_emoji_split_across_tokens_waits_for_its_last_byte() -> None:
    thumbs = "👍".encode()
    det = IncrementalDetokenizer()
    assert det.push(thumbs[:2]) == ("", False)
    assert det.push(thumbs[2:] + b"!") == ("👍!", False)


def test_incomplete_character_at_the_end_is_dropped() -> None:
    det = IncrementalDetokenizer()
    assert det.push(b"ok" + "漢".encode()[:2]) == ("ok", False)
    assert det.flush() == ""


def test_str_pieces_for_engines_that_detokenise_themselves() -> None:
    det = IncrementalDetokenizer(stop=["</s>"])
    assert det.push("漢字<") == ("漢字", False)
    assert det.push("/s>tail") == ("", True)


def test_cost_is_linear_not_quadratic() -> None:
    """A long reply pushes each piece once; the held-back buffer never grows past the stop length."""
    det = IncrementalDetokenizer(stop=["\n\nUser:"])
    total = 0
    for _ in range(20000):
        text, _ = det.push(b"word ")
        total += len(text)
        assert len(det._held) < len("\n\nUser:")
    assert total == 5 * 20000
