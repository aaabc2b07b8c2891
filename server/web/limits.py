"""``TokenBucket``: the frame-rate limit of one ``/ws`` connection (pure; the clock is given)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take`` spends one or says how long to wait."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._at = clock()

    def take(self) -> float:
        """0.0 when a token was spent; else the seconds until one is there (nothing spent)."""
        now = self._clock()
        if self.rate > 0:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate if self.rate > 0 else float("inf")
