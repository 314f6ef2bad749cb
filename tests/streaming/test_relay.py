"""The receiving end of the cross-replica relay (app/streaming/relay.py): what another replica
published about a reply, applied to the live one here. Real manager, synthetic engine."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.streaming import relay
from app.streaming.events import CancelCause, Status
from app.streaming.manager import GenerationManager
from app.streaming.subscriber import live_events
from tests.streaming.core import ended, start_reply

LONG = 5000  # tokens: several seconds of synthetic steps, far longer than any test here waits


@pytest.mark.parametrize(
    ("action", "status"),
    [
        ("user", Status.CANCELLED),
        ("admin", Status.CANCELLED),
        ("disconnect", Status.DISCONNECTED),
        ("deadline", Status.DISCONNECTED),
        ("shutdown", Status.INTERRUPTED),
    ],
)
async def test_a_relayed_cancel_stops_the_reply_here_with_its_cause(
    manager: GenerationManager, action: str, status: Status
) -> None:
    generation = await start_reply(manager, tokens=LONG)
    relay.receive(manager, generation.message_id, action)
    outcome = await ended(generation)
    assert generation.cancel_cause is CancelCause(action)
    assert outcome.status is status
    assert len(outcome.text) < LONG


async def test_a_relayed_attach_restarts_the_grace_of_a_reply_whose_client_left(
    manager: GenerationManager,
) -> None:
    grace_s = 0.5
    generation = await start_reply(manager, tokens=LONG, grace_s=grace_s)
    events = live_events(generation, transport="sse", after=0, keepalive_s=1)
    await anext(events)  # Start: subscribed
    loop = asyncio.get_running_loop()
    await events.aclose()  # the client left: the grace starts now
    left_at = loop.time()
    await asyncio.sleep(0.6 * grace_s)
    attached_at = loop.time()
    relay.receive(manager, generation.message_id, "attach")  # it follows through another replica
    outcome = await ended(generation)
    # Aborted once the restarted grace ran out, not when the first one would have.
    assert generation.cancel_cause is CancelCause.DISCONNECT
    assert outcome.status is Status.DISCONNECTED
    assert loop.time() >= attached_at + grace_s > left_at + grace_s


async def test_an_unknown_action_is_logged_and_ignored(
    manager: GenerationManager, caplog: pytest.LogCaptureFixture
) -> None:
    generation = await start_reply(manager, tokens=200)
    with caplog.at_level(logging.WARNING, logger="app.streaming.relay"):
        relay.receive(manager, generation.message_id, "frobnicate")
    assert "unknown cause 'frobnicate'" in caplog.text
    assert (await ended(generation)).status is Status.COMPLETED
    assert generation.cancel_cause is None


async def test_actions_for_a_reply_not_live_here_change_nothing(manager: GenerationManager) -> None:
    generation = await start_reply(manager, tokens=200)
    for action in ("user", "attach"):  # every replica hears every action: only one runs it
        relay.receive(manager, "running-elsewhere", action)
    assert (await ended(generation)).status is Status.COMPLETED
    assert manager.get("running-elsewhere") is None
