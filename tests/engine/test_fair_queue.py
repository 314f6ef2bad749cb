"""The engines' waiting queue: fair across owners, FIFO within one (pure Python, no model)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.engine.fair_queue import FairQueue


@dataclass(eq=False)
class Req:
    owner: str | None
    name: str


def queue() -> FairQueue[Req]:
    return FairQueue(lambda r: r.owner)


def admit(q: FairQueue[Req], n: int) -> list[str]:
    return [q.pop().name for _ in range(n)]


def test_one_owner_is_plain_fifo() -> None:
    q = queue()
    q.extend(Req(None, f"r{i}") for i in range(5))
    assert [r.name for r in q] == ["r0", "r1", "r2", "r3", "r4"]
    assert admit(q, 5) == ["r0", "r1", "r2", "r3", "r4"]
    assert not q and len(q) == 0 and q.peek() is None
    with pytest.raises(IndexError):
        q.pop()


def test_a_newcomer_goes_before_a_flooding_owners_backlog() -> None:
    """60 sends of one user, then one of another: the other is next, not 61st (FIFO: 61st)."""
    q = queue()
    flood = [Req("a", f"a{i}") for i in range(60)]
    q.extend(flood)
    assert admit(q, 16) == [f"a{i}" for i in range(16)]  # the engine's 16 slots fill up
    q.append(Req("b", "b0"))
    assert q.peek() is not None and q.peek().name == "b0"  # type: ignore[union-attr]
    assert admit(q, 2) == ["b0", "a16"]


def test_owners_with_backlogs_take_turns_fewest_running_first() -> None:
    q = queue()
    q.extend(Req("a", f"a{i}") for i in range(4))
    q.extend(Req("b", f"b{i}") for i in range(4))
    q.append(Req("c", "c0"))
    # all at 0 running: oldest first (a0); then b and c have fewer running than a, and so on
    assert admit(q, 9) == ["a0", "b0", "c0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_finished_requests_stop_counting_for_their_owner() -> None:
    q = queue()
    a = [Req("a", f"a{i}") for i in range(3)]
    b = [Req("b", f"b{i}") for i in range(3)]
    q.extend([*a, *b])
    assert admit(q, 2) == ["a0", "b0"]
    q.done(a[0])  # a0 ended: a has 0 running, b has 1
    assert admit(q, 1) == ["a1"]
    assert admit(q, 2) == ["a2", "b1"]  # a tie (1 running each): the oldest waiting goes first


def test_remove_drops_a_waiting_request_and_iteration_is_arrival_order() -> None:
    q = queue()
    reqs = [Req("a", "a0"), Req("b", "b0"), Req("a", "a1"), Req("b", "b1")]
    q.extend(reqs)
    assert [r.name for r in q] == ["a0", "b0", "a1", "b1"]
    assert reqs[1] in q
    q.remove(reqs[1])
    assert reqs[1] not in q and len(q) == 3
    with pytest.raises(ValueError):
        q.remove(reqs[1])
    q.remove(reqs[3])  # b's last: b leaves the rotation
    assert admit(q, 2) == ["a0", "a1"]
    q.clear()
    assert not q
