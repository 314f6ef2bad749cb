"""The synthetic engine's Markdown-heavy replies (the ``[[synthetic:markdown]]`` marker).

Headings, paragraphs with long inline code, nested lists, GFM tables and many fenced code blocks,
chosen by the same deterministic LCG as the plain replies, so that the page's Markdown rendering
can be measured on a long reply (bench/long_reply_render.py). Each block comes out a few words at a
time, as a model writes it, so that a block is often open (a fence not yet closed, a table half
written) when the page renders.
"""

from __future__ import annotations

from app.engine.synthetic.text import WORDS, ReplyGenerator

_IDENTS = ("stream", "token", "reply", "cache", "batch", "step", "engine", "offset", "delta")
_LANGS = ("python", "js", "sql", "bash", "")


class MarkdownReplyGenerator(ReplyGenerator):
    """ReplyGenerator whose text is Markdown blocks instead of words and sentences."""

    __slots__ = ("_pending",)

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self._pending: list[str] = []

    def _pick(self, choices: tuple[str, ...]) -> str:
        return choices[self._next_random() % len(choices)]

    def _words_of(self, n: int) -> str:
        return " ".join(self._pick(WORDS) for _ in range(n))

    def _next_piece(self) -> str:
        if not self._pending:
            self._pending = self._block()
            self._pending.reverse()
        return self._pending.pop()

    def _block(self) -> list[str]:
        """The next block, in pieces (roughly words); blocks are separated by a blank line."""
        kind = self._next_random() % 6
        sep = "" if self._words == 0 else "\n\n"
        self._words += 1
        if kind == 0:
            level = "#" * (1 + self._next_random() % 3)
            return [f"{sep}{level} ", *self._split(self._words_of(4))]
        if kind == 1:
            return [sep, *self._split(self._paragraph())]
        if kind == 2:
            return [sep, *self._list()]
        if kind == 3:
            return [sep, *self._table()]
        return [sep, *self._code()]

    def _split(self, text: str) -> list[str]:
        parts = text.split(" ")
        return [parts[0], *(" " + p for p in parts[1:])]

    def _paragraph(self) -> str:
        ident = ".".join(self._pick(_IDENTS) for _ in range(6 + self._next_random() % 6))
        call = (
            f"`{ident}({self._pick(_IDENTS)}=[{', '.join(self._pick(_IDENTS) for _ in range(8))}])`"
        )
        return f"{self._words_of(8)} **{self._pick(WORDS)}** {call} {self._words_of(6)} *{self._pick(WORDS)}*."

    def _list(self) -> list[str]:
        lines = []
        for i in range(3 + self._next_random() % 3):
            lines.append(f"{i + 1}. {self._words_of(4)} `{self._pick(_IDENTS)}_{i}`\n")
            for _ in range(self._next_random() % 3):
                lines.append(f"   - {self._words_of(3)}\n")
                if self._next_random() % 3 == 0:
                    lines.append(f"     - {self._words_of(2)}\n")
        lines[-1] = lines[-1].rstrip("\n")
        return lines

    def _table(self) -> list[str]:
        cols = 3 + self._next_random() % 2
        rows = [
            "| " + " | ".join(self._pick(_IDENTS) for _ in range(cols)) + " |\n",
            "|" + "|".join([":---", "---:", ":---:", "---"][c % 4] for c in range(cols)) + "|\n",
        ]
        for _ in range(3 + self._next_random() % 4):
            cells = (
                f"`{self._pick(_IDENTS)}`" if c == 0 else self._words_of(2) for c in range(cols)
            )
            rows.append("| " + " | ".join(cells) + " |\n")
        rows[-1] = rows[-1].rstrip("\n")
        return rows

    def _code(self) -> list[str]:
        lang = self._pick(_LANGS)
        lines = [f"```{lang}\n"]
        for i in range(4 + self._next_random() % 10):
            indent = "    " * (i % 3)
            name = self._pick(_IDENTS)
            lines.append(
                f"{indent}{name}_{i} = {self._pick(_IDENTS)}({name!r}, {i}) < {i * 7} && x\n"
            )
        lines.append("```")
        return lines
