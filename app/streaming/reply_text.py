"""A reply's text as it grows: appended a piece (a token's text) at a time, read from any offset.

Kept small, because a server holds every live reply's text: a `str` per piece cost ~80 bytes of
object header on top of its characters, and a list of ints and floats per piece ~60 more, some
300 bytes a token in all (a stalled-reader test grew a server by 325 MB for 4.4 million
characters). Pieces are folded into one string every `FOLD` of them, and each piece's end offset
lives in an `array` (8 bytes): what is left per token is its characters and 8 bytes.
"""

from __future__ import annotations

import bisect
from array import array

FOLD = 64  # pieces joined into one string at a time


class ReplyText:
    __slots__ = ("_chunk_ends", "_chunks", "_tail", "_tail_start", "length", "piece_ends")

    def __init__(self) -> None:
        self._chunks: list[str] = []  # folded pieces
        self._chunk_ends = array("q")  # the character offset where each chunk ends
        self._tail: list[str] = []  # the pieces since the last fold
        self._tail_start = 0
        self.piece_ends = array("q")  # the character offset where each piece ends
        self.length = 0

    def append(self, piece: str) -> None:
        self._tail.append(piece)
        self.length += len(piece)
        self.piece_ends.append(self.length)
        if len(self._tail) >= FOLD:
            self._chunks.append("".join(self._tail))
            self._chunk_ends.append(self.length)
            self._tail.clear()
            self._tail_start = self.length

    def __str__(self) -> str:
        return "".join(self._chunks) + "".join(self._tail)

    def since(self, offset: int) -> str:
        """The text from character `offset` on."""
        if offset >= self.length:
            return ""
        tail = self._tail
        if offset >= self._tail_start:  # the usual case, a client near the end: join only after it
            first = bisect.bisect_right(self.piece_ends, offset)  # the piece that holds `offset`
            k = first - (len(self.piece_ends) - len(tail))
            piece_start = self.piece_ends[first] - len(tail[k])
            return tail[k][offset - piece_start :] + "".join(tail[k + 1 :])
        i = bisect.bisect_right(self._chunk_ends, offset)
        chunk_start = self._chunk_ends[i] - len(self._chunks[i])
        return (
            self._chunks[i][offset - chunk_start :] + "".join(self._chunks[i + 1 :]) + "".join(tail)
        )

    def pieces_between(self, start: int, end: int) -> int:
        """How many pieces the text between two piece boundaries was appended in."""
        return (
            bisect.bisect_left(self.piece_ends, end)
            - bisect.bisect_right(self.piece_ends, start)
            + 1
        )
