"""A small in-process limiter for login attempts: failures per client address and per email.

Slows password guessing without locking the real user out for long: after `max_failures` failed
attempts within `window_s`, further attempts from that address (or against that email) get 429
until the oldest failure leaves the window. A success clears the email's count.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque


class LoginRateLimiter:
    def __init__(self, max_failures: int = 5, window_s: float = 60.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: defaultdict[str, deque[float]] = defaultdict(deque)

    def _recent(self, key: str, now: float) -> deque[float]:
        stamps = self._failures[key]
        while stamps and now - stamps[0] > self.window_s:
            stamps.popleft()
        if not stamps:
            del self._failures[key]  # keep the table from growing with one-off keys
            return deque()
        return stamps

    def retry_after(self, address: str, email: str) -> float:
        """Seconds until an attempt is allowed; 0 when it is allowed now."""
        now = time.monotonic()
        waits = [
            self.window_s - (now - stamps[0])
            for stamps in (self._recent(f"ip:{address}", now), self._recent(f"email:{email}", now))
            if len(stamps) >= self.max_failures
        ]
        return max(waits, default=0.0)

    def failed(self, address: str, email: str) -> None:
        now = time.monotonic()
        self._failures[f"ip:{address}"].append(now)
        self._failures[f"email:{email}"].append(now)

    def succeeded(self, email: str) -> None:
        self._failures.pop(f"email:{email}", None)
