"""Reading and stopping a reply that is not live here, by polling the ledger (app/streaming/poller.py).

In process, over `MemoryLedger` (tests/streaming/core.py): each read returns the next stored version
of the row, as another replica's flushes would leave it. Intervals are powers of two, so that
counting polls is exact arithmetic.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.streaming.events import CancelCause, Delta, Final, Start, Status, StreamEvent
from app.streaming.generation import final_from_outcome
from app.streaming.poller import ReplyPoller
from tests.streaming.core import MemoryLedger, stored

POLL_S = 2**-7  # about 8 ms
ID = "elsewhere-1"


async def collect(events: AsyncIterator[StreamEvent | None]) -> list[StreamEvent | None]:
    """Every event, heartbeats (None) included; a stream that does not end fails the test."""
    async with asyncio.timeout(10):
        return [event async for event in events]


def poller(store: MemoryLedger, *, grace_s: float = 0.0) -> ReplyPoller:
    return ReplyPoller(store, grace_s=grace_s, poll_s=POLL_S, stop_poll_s=POLL_S)


async def test_a_finished_reply_replays_from_the_offset_to_its_final_without_polling() -> None:
    text = "A finished reply, stored whole."
    reply = stored(text, Status.COMPLETED)
    for after in (0, 1, 12, len(text) - 1, len(text), len(text) + 50, -5):
        store = MemoryLedger()
        events = await collect(
            poller(store).events(reply, conversation_id="conv-1", after=after, keepalive_s=1.0)
        )
        offset = min(max(after, 0), len(text))  # clamped to the text, as a live resume is
        assert events[0] == Start(id=offset, message_id=ID, conversation_id="conv-1")
        rest = [Delta(id=len(text), text=text[offset:])] if offset < len(text) else []
        assert events[1:-1] == rest
        final = events[-1]
        assert isinstance(final, Final) and final == final_from_outcome(reply)
        assert final.status is Status.COMPLETED and final.id == len(text) and final.saved
        assert store.log == [], "a finished row is the end: nothing read again, no attach"


async def test_a_reply_streaming_elsewhere_is_polled_as_its_text_grows_until_it_ends() -> None:
    whole = "Hello world"
    versions = [stored("Hel"), stored("Hel"), stored("Hello wor"), stored(whole, Status.LENGTH)]
    for after, deltas in [
        (0, [Delta(3, "Hel"), Delta(9, "lo wor"), Delta(11, "ld")]),
        # Ahead of what is stored (the other replica flushes about once a second): the text
        # resumes from the client's offset once the row has it, not clamped back.
        (5, [Delta(9, " wor"), Delta(11, "ld")]),
    ]:
        store = MemoryLedger(versions={ID: list(versions)})
        events = await collect(
            poller(store).events(stored(""), conversation_id="c", after=after, keepalive_s=60)
        )
        assert events[0] == Start(id=after, message_id=ID, conversation_id="c")
        assert events[1:-1] == deltas
        assert "".join(d.text for d in deltas) == whole[after:]  # nothing missing, nothing twice
        final = events[-1]
        assert isinstance(final, Final) and final.status is Status.LENGTH and final.id == len(whole)
        assert store.loads == len(versions)


async def test_attach_is_published_once_per_third_of_the_grace_while_polling() -> None:
    # grace 24 polls: the replica running the reply hears "still watched" every 8 polls.
    store = MemoryLedger(versions={ID: [stored("abc")] * 30 + [stored("abcd", Status.COMPLETED)]})
    await collect(
        poller(store, grace_s=24 * POLL_S).events(
            stored("abc"), conversation_id="c", after=0, keepalive_s=60
        )
    )
    assert store.published() == [("attach", 0), ("attach", 8), ("attach", 16), ("attach", 24)]

    # No grace (or one shorter than a poll): once per poll, not more often.
    store = MemoryLedger(versions={ID: [stored("a")] * 3 + [stored("ab", Status.COMPLETED)]})
    await collect(poller(store).events(stored("a"), conversation_id="c", after=0, keepalive_s=60))
    assert store.published() == [("attach", 0), ("attach", 1), ("attach", 2), ("attach", 3)]


async def test_an_idle_poll_yields_none_each_keepalive_and_new_text_restarts_the_count() -> None:
    store = MemoryLedger(
        versions={ID: [stored("ab")] * 9 + [stored("abc")] * 3 + [stored("abcd", Status.COMPLETED)]}
    )
    events = await collect(
        poller(store).events(stored("ab"), conversation_id="c", after=0, keepalive_s=4 * POLL_S)
    )
    # 9 idle polls after "ab": a heartbeat after the 4th and the 8th; then "c" arrives, and the
    # 3 polls before the end are fewer than 4: no heartbeat.
    assert events[1:-1] == [Delta(2, "ab"), None, None, Delta(3, "c"), Delta(4, "d")]
    assert isinstance(events[-1], Final)


async def test_a_reply_deleted_meanwhile_ends_the_stream_without_a_final() -> None:
    store = MemoryLedger(versions={ID: [stored("abc"), None]})
    events = await collect(
        poller(store).events(stored("ab"), conversation_id="c", after=0, keepalive_s=60)
    )
    assert events == [
        Start(id=0, message_id=ID, conversation_id="c"),
        Delta(2, "ab"),
        Delta(3, "abc"[2:]),
    ]
    assert store.loads == 2


async def test_stop_elsewhere_publishes_the_cancel_then_returns_the_stored_end() -> None:
    store = MemoryLedger(
        versions={ID: [stored("ab"), stored("ab"), stored("abc", Status.CANCELLED)]}
    )
    assert await poller(store).stop(ID, CancelCause.ADMIN, wait_s=10) == "cancelled"
    assert store.log[0] == ("publish", ID, "admin", 0), "asked before watching"
    assert store.loads == 3, "returns as soon as the store shows the end"

    store = MemoryLedger(versions={ID: [stored("ab"), None]})
    assert await poller(store).stop(ID, CancelCause.USER, wait_s=10) == "deleted"


async def test_stop_elsewhere_answers_streaming_when_no_end_is_stored_in_time() -> None:
    store = MemoryLedger(versions={ID: [stored("ab")]})
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await poller(store).stop(ID, CancelCause.USER, wait_s=0.1) == "streaming"
    assert loop.time() - started >= 0.1
    assert store.published() == [("user", 0)]
    assert 1 <= store.loads <= 0.1 / POLL_S + 1
