"""Signing a user out everywhere (app/domain/chat/sign_outs.py): two "replicas" in this process,
each with its own manager, hub and LISTEN connection to the real PostgreSQL. A sign-out on one
stops the user's reply on the other (cancelled), ends their push channels there with
`signed_out`, and closes their sockets there; another user's are untouched. The live tests over a
real server and two real replicas are tests/serving/test_live_sign_out*.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from app.db.broadcast import PostgresBroadcast
from app.domain.chat.push_events import SignedOut, UserPush
from app.domain.chat.sign_outs import SignOuts
from app.streaming.events import CancelCause, Status
from app.streaming.manager import GenerationManager
from app.streaming.push import PushHub
from tests.live_server import TEST_POSTGRES_URL
from tests.streaming.core import ended, start_reply


async def test_a_sign_out_ends_the_users_reply_channels_and_sockets_on_the_other_replica(
    make_manager: Callable[..., Awaitable[GenerationManager]],
) -> None:
    relays = [PostgresBroadcast(TEST_POSTGRES_URL, "streamchat_test_sign_outs") for _ in range(2)]
    managers = [await make_manager(), await make_manager()]
    pushes = [UserPush(PushHub(), m, r.publish) for m, r in zip(managers, relays, strict=True)]
    replicas = [SignOuts(m, p) for m, p in zip(managers, pushes, strict=True)]
    for relay, push in zip(relays, pushes, strict=True):
        await relay.start(push.receive)
    closed: list[tuple[str, str]] = []
    try:
        generation = await start_reply(managers[1], tokens=100_000)  # user-1's, on replica 1
        other = await start_reply(managers[1], tokens=100_000)
        other.user_id = "user-2"
        hub = pushes[1].hub
        with (
            hub.subscribe("user-1") as channel,
            hub.subscribe("user-2") as bystander,
            replicas[1].watch("user-1", 0, lambda why: closed.append(("user-1", why))),
            replicas[1].watch("user-2", 0, lambda why: closed.append(("user-2", why))),
        ):
            replicas[0].sign_out("user-1", "disabled")  # replica 0 runs nothing of theirs
            outcome = await asyncio.wait_for(ended(generation), 5)
            assert outcome.status is Status.CANCELLED
            assert generation.cancel_cause is CancelCause.SIGNED_OUT
            events = [e async for e in channel.events(keepalive_s=5)]
            assert events == [SignedOut("disabled")]  # its last event, then the channel ends
            assert closed == [("user-1", "disabled")]
            assert other.outcome is None and hub.channel_count("user-2") == 1
            assert len(bystander) == 0 and replicas[1].connection_count("user-2") == 1
            other.cancel(CancelCause.USER)
    finally:
        for relay in relays:
            await relay.stop()


async def test_logging_out_everywhere_leaves_the_api_calls_running(
    manager: GenerationManager,
) -> None:
    """Logging out everywhere ends the sessions, not the API keys: a `/v1` call goes on."""
    sign_outs = SignOuts(manager, UserPush(PushHub(), manager))
    page = await start_reply(manager, tokens=100_000)
    api = await start_reply(manager, tokens=100_000)
    api.source = "api"
    sign_outs.sign_out("user-1", "logged_out")
    assert (await asyncio.wait_for(ended(page), 5)).status is Status.CANCELLED
    await asyncio.sleep(0.05)
    assert api.outcome is None
    sign_outs.sign_out("user-1", "disabled")
    assert (await asyncio.wait_for(ended(api), 5)).status is Status.CANCELLED
