"""Delivery pacing: when the event loop is nearly saturated, each client gets new text at most
once per tick, merged.

One process streams every token the engine makes. While the event loop has room, a subscriber is
woken by each new piece of text and sends it at once: the smoothest stream, and what the latency
benchmarks compare. At GPU rates (a thousand streams, each gaining a token every step) the loop
runs out: every event costs the same fixed work whatever it carries (a task wake-up, the framing,
the ASGI send chain, a socket write), and the streams fall behind the engine. Then a subscriber
sends no sooner than one tick after its previous send; text arriving meanwhile leaves with the
next send, merged (the wire carries text, not tokens: `Subscriber` already merges whatever arrived
since its last send). A stream slower than the tick is never held back. The fixed work is paid
once per tick instead of once per token.

The tick adapts (LibreChat's fixed `STREAM_DELTA_COALESCE_MS` is the idea): a probe reads the
event-loop thread's CPU time every `PROBE_S`; while the loop is busy more than `busy` of the time
(on average) the tick grows, up to `max_tick_s`, and once it has room again the tick shrinks back
to off. Ends, stops and heartbeats are never paced: only new text waits.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from app.streaming import metrics

if TYPE_CHECKING:
    from app.streaming.subscriber import Subscriber

PROBE_S = 0.05  # how often the loop's busy share is sampled
SMOOTHING = 0.3  # the newest sample's weight in the running average
MIN_TICK_S = 0.02  # the first tick once pacing starts; below it, pacing stops
GROWTH = 1.5  # the tick's factor per busy probe
SHRINK = 0.8  # ... and per probe that finds room
ROOM = 0.75  # room again: busy below this share of the threshold


class DeliveryPacer:
    """One per process (the manager's): `wake` stands in for `Subscriber.wake` on new text."""

    def __init__(self, *, max_tick_s: float, busy: float) -> None:
        self.max_tick_s = max_tick_s  # 0: never pace
        self.busy = busy  # the loop thread's share of CPU time that starts pacing
        self.tick_s = 0.0  # 0: off, subscribers are woken at once
        self.busy_average = 0.0
        self._probe: asyncio.TimerHandle | None = None
        self._probed_at = (0.0, 0.0)  # (wall, the loop thread's CPU time) at the last probe

    def wake(self, subscriber: Subscriber) -> None:
        if self.tick_s:
            subscriber.wake_after(self.tick_s)
        else:
            subscriber.wake()

    # -- the probe: on the event loop's thread, so `thread_time` is the loop's own CPU ---------

    def start(self) -> None:
        if self.max_tick_s > 0 and self._probe is None:
            self._probed_at = (time.monotonic(), time.thread_time())
            self._probe = asyncio.get_running_loop().call_later(PROBE_S, self._probed)

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        self.busy_average = self.tick_s = 0.0
        metrics.DELIVERY_TICK.set(0.0)

    def _probed(self) -> None:
        wall, cpu = time.monotonic(), time.thread_time()
        last_wall, last_cpu = self._probed_at
        self._probed_at = (wall, cpu)
        if wall > last_wall:
            self.observe(min(1.0, (cpu - last_cpu) / (wall - last_wall)))
        self._probe = asyncio.get_running_loop().call_later(PROBE_S, self._probed)

    def observe(self, busy: float) -> None:
        """Fold one sample of the loop's busy share (0-1) into the average and move the tick (the
        probe's step; tests drive it directly)."""
        self.busy_average += SMOOTHING * (busy - self.busy_average)
        if self.busy_average > self.busy:
            self.tick_s = min(self.max_tick_s, max(MIN_TICK_S, self.tick_s * GROWTH))
        elif self.busy_average < self.busy * ROOM and self.tick_s:
            shrunk = self.tick_s * SHRINK
            self.tick_s = shrunk if shrunk >= MIN_TICK_S else 0.0
        metrics.DELIVERY_TICK.set(self.tick_s)
