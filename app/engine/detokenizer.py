"""Incremental detokenisation with stop strings: emit only text that can never be taken back.

Two things make a token's text unsafe to send at once:
- it may end part-way through a multi-byte UTF-8 character (emoji, CJK, ...): the rest comes with the
  next token, so the incomplete bytes wait in an incremental UTF-8 decoder;
- its end may be the start of a stop string ("\\n\\nUs" of "\\n\\nUser:"): the next token could complete
  it, and sent text cannot be retracted, so the longest such suffix is held back.

Each `push` costs time proportional to the new text plus the held-back text (at most the longest
stop string), never to the whole reply. `reference_detokenize` is the obvious full re-decode,
kept as the oracle the tests compare this against.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence


def _holdback_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    keep = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), keep, -1):
            if text.endswith(stop[:k]):
                keep = k
                break
    return keep


def _find_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest stop string in `text`, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i != -1]
    return min(found, default=-1)


class IncrementalDetokenizer:
    """Turns a token's raw piece (bytes, or str for engines that detokenise themselves) into stable text."""

    __slots__ = ("_decoder", "_held", "_stopped", "stops")

    def __init__(self, stop: Iterable[str] = ()) -> None:
        self.stops = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet emitted: a possible stop-string prefix
        self._stopped = False

    def push(self, piece: bytes | str) -> tuple[str, bool]:
        """Add one token's piece; return (text now safe to emit, whether a stop string was hit).

        After a stop string is hit the text is cut right before it, and later pushes return nothing.
        """
        if self._stopped:
            return "", True
        new = piece if isinstance(piece, str) else self._decoder.decode(piece)
        if not self.stops:
            return new, False
        text = self._held + new
        at = _find_stop(text, self.stops)
        if at != -1:
            self._held = ""
            self._stopped = True
            return text[:at], True
        keep = _holdback_length(text, self.stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The reply is over: release held-back text; an incomplete trailing character is dropped."""
        held, self._held = self._held, ""
        self._decoder.reset()
        return "" if self._stopped else held


def _decode_complete(data: bytes) -> str:
    """Decode, leaving out an incomplete character at the very end (it may still be completed)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8", errors="replace")
        return data.decode("utf-8", errors="replace")


def reference_detokenize(
    pieces: Sequence[bytes], stop: Sequence[str] = ()
) -> list[tuple[str, bool]]:
    """The test oracle: re-decode everything after every token (quadratic, obviously right)."""
    out: list[tuple[str, bool]] = []
    sent = ""
    for n in range(1, len(pieces) + 1):
        full = _decode_complete(b"".join(pieces[:n]))
        at = _find_stop(full, stop)
        if at != -1:
            out.append((full[len(sent) : at], True))
            break
        stable = full[: len(full) - _holdback_length(full, stop)]
        out.append((stable[len(sent) :], False))
        sent = stable
    return out
