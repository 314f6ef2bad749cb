"""What of a long conversation the model sees: its history fitted to the context, in steps.

A page prompt is the system prompt, then the newest whole turns of the branch (a question with its
replies) that fit, then the new question. The room for history is the context less the reply's
reserve (its max_tokens), the engine's prompt overhead, the system prompt and the question; turns
are dropped oldest first, never the system prompt or the new question. A question that cannot fit
even alone is refused (`MessageTooLongError`), naming the longest message that fits.

The window moves in steps, so the engine's prefix cache keeps working: a reply keeps the previous
reply's window start for as long as the history from there still fits (the prompt then only grows
at its end, and everything before the new turn is a cache hit); when it no longer fits, the start
moves forward until the history left holds at most about half the room, so that the next several
turns share that new prefix again. Dropping one turn per send instead would change the prompt's
start on every send: every turn a cold prefill of the whole window.

Each reply stores where its window began (`Message.window_start_id`, None: from the start), so a
regenerate, the admin and an export can say what the model saw. Each message stores its token
count (`Message.token_count`), counted once by the engine (`Engine.count_tokens`), so fitting a
5,000-message history adds up stored numbers instead of tokenising it again. The engine still
checks the whole rendered prompt (`generate`): these counts only have to be close.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from app.domain.errors import InvalidInputError

Count = Callable[[Mapping[str, str]], int]


class MessageTooLongError(InvalidInputError):
    """A new message that does not fit the model's context even with no history at all (a 400)."""

    def __init__(self, tokens: int, limit: int, context: int) -> None:
        self.tokens, self.limit, self.context = tokens, limit, context
        super().__init__(
            f"the message is {tokens} tokens; the longest that fits is {limit} tokens (the model's "
            f"context holds {context}, with room kept for the system prompt and the reply)",
            field="content",
        )


def window_start(turns: Sequence[int], room: int, previous: int) -> int:
    """The index of the first of `turns` (token counts, oldest first) the prompt keeps, given
    `room` tokens for them and the previous reply's start `previous` (0: from the start).

    Keeps `previous` while the turns from there fit; otherwise the first start from which they
    take at most half of `room` (or, when even the newest turn alone takes more than that, the
    newest turn if it fits, else none: `len(turns)`). Pure: see the module docstring."""
    n = len(turns)
    suffix = [0] * (n + 1)  # suffix[i]: the tokens of turns[i:]
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + turns[i]
    kept = min(max(previous, 0), n)
    if suffix[kept] <= room:
        return kept
    half = room // 2
    start = next(i for i in range(kept, n + 1) if suffix[i] <= half)
    if start == n and n > kept and suffix[n - 1] <= room:
        return n - 1
    return start


@dataclass(slots=True)
class Said:
    """One message of the branch, as the fitting needs it."""

    id: UUID
    role: str
    content: str
    tokens: int | None  # stored count; None: not counted yet


@dataclass(slots=True)
class Fitted:
    """A prompt fitted to the context, and what to store about it."""

    messages: list[dict[str, str]]  # system prompt, the window's messages, the new question
    question_id: UUID
    # the window's first message: None from the start, the question's id when no history fits
    window_start_id: UUID | None
    question_tokens: int
    prompt_tokens: int  # the prompt's estimate: counts plus the engine's overhead
    counted: dict[UUID, int] = field(default_factory=dict)  # counts made now, to store


def _turns(history: Sequence[Said]) -> list[list[Said]]:
    """The history in turns: each starts at a question (or at the very first message)."""
    turns: list[list[Said]] = []
    for said in history:
        if said.role == "user" or not turns:
            turns.append([])
        turns[-1].append(said)
    return turns


def _first_id(turns: list[list[Said]], start: int, question_id: UUID) -> UUID | None:
    """The window's first message: None from the start, the question itself when no turn fits."""
    if start == 0:
        return None
    return turns[start][0].id if start < len(turns) else question_id


@dataclass(frozen=True, slots=True)
class Room:
    """The context's share-out for one prompt."""

    context: int  # the engine's context size
    reply: int  # the reply's reserve: its max_tokens
    overhead: int  # the engine's prompt overhead

    def for_messages(self, system_tokens: int) -> int:
        """Tokens left for history and question: also the longest message that fits alone."""
        return max(0, self.context - self.reply - self.overhead - system_tokens)


def fit(
    history: Sequence[Said],
    question: Said,
    *,
    system_prompt: str,
    room: Room,
    count: Count,
    previous_start: UUID | None,
) -> Fitted:
    """The prompt for `question` (its row's id, new or stored) after `history` (the branch before
    it, oldest first). `previous_start`: where the previous reply's window began (None: from the
    start; an id no longer in `history` counts as the start). Raises MessageTooLongError."""
    counted: dict[UUID, int] = {}
    for said in history:
        if said.tokens is None:
            said.tokens = counted[said.id] = count({"role": said.role, "content": said.content})
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    system_tokens = sum(count(m) for m in system)
    asked = {"role": "user", "content": question.content}
    question_tokens = question.tokens if question.tokens is not None else count(asked)
    space = room.for_messages(system_tokens)
    if question_tokens > space:
        raise MessageTooLongError(question_tokens, space, room.context)
    turns = _turns(history)
    sizes = [sum(s.tokens or 0 for s in turn) for turn in turns]
    starts = {t[0].id: i for i, t in enumerate(turns)}
    previous = len(turns) if previous_start == question.id else starts.get(previous_start, 0)
    start = window_start(sizes, space - question_tokens, previous)
    kept = [s for turn in turns[start:] for s in turn]
    return Fitted(
        messages=[*system, *({"role": s.role, "content": s.content} for s in kept), asked],
        question_id=question.id,
        window_start_id=_first_id(turns, start, question.id),
        question_tokens=question_tokens,
        prompt_tokens=room.overhead + system_tokens + sum(sizes[start:]) + question_tokens,
        counted=counted,
    )
