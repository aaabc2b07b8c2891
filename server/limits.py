"""Per-connection bounds the stack below does not give: a frame-rate token bucket for ``/ws`` and
a deadline for HTTP request heads (slowloris).

uvicorn times out an idle kept-alive connection only after a response, and never a request head
that trickles in a byte at a time; ``GuardedH11Protocol`` arms a timer whenever the connection waits
for a head (when it opens, and after each response) and closes the transport if the head has not
arrived when it fires. A connection upgraded to a WebSocket is past its head and is left alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


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


def guarded_h11(head_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on every request head."""

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # a kept-alive connection waits for its next head under the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(head_timeout, self._head_overdue)

        def _head_overdue(self) -> None:
            # IDLE on the client's side: no complete head since the connection opened or the last
            # response ended (an upgraded or busy connection has left IDLE).
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
