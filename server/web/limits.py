"""``TokenBucket``: the frame-rate limit of one ``/ws`` connection (pure; the clock is given), and
``UserBuckets``: one more bucket per signed-in user, over all their connections."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


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


class UserBuckets:
    """One ``TokenBucket`` per signed-in user (``[auth] user_frame_rate``), shared by all their sockets
    on this instance, so opening more sockets does not buy more frames; forgotten with the last one."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.held: dict[str, tuple[TokenBucket, int]] = {}

    @contextmanager
    def of(self, user_id: str | None) -> Iterator[TokenBucket | None]:
        if user_id is None:  # nobody signs in: the per-connection limit is the only one
            yield None
            return
        bucket, count = self.held.get(user_id) or (TokenBucket(self.rate, self.burst), 0)
        self.held[user_id] = (bucket, count + 1)
        try:
            yield bucket
        finally:
            bucket, count = self.held[user_id]
            if count <= 1:
                del self.held[user_id]
            else:
                self.held[user_id] = (bucket, count - 1)
