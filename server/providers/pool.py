"""``FastPool``: httpcore's connection pool (so httpx's client, its limits, pool timeout, keep-alive
expiry and errors stay as they are) whose connections are ``h1.H1Connection`` (responses parsed in
C), and whose assignment pass does not walk every connection it holds on each request (see
``FastPool._assign_requests_to_connections``).
"""

from __future__ import annotations

import time
from typing import Any, cast

import httpcore

from server.providers.h1 import H1Connection

SWEEP_SECONDS = 0.25  # how often a pass walks every connection: drops closed ones, closes expired ones

Key = tuple[bytes, bytes, int]


def _key(origin: httpcore.Origin) -> Key:
    return origin.scheme, origin.host, origin.port  # httpcore's Origin is not hashable


class FastPool(httpcore.AsyncConnectionPool):
    """httpcore's pool, its connections ``H1Connection``, its idle ones indexed by origin."""

    _next_sweep = 0.0  # monotonic time of the next pass that walks every connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Idle connections no request holds, by origin, the longest idle first. A connection enters
        # as its response closes, leaves as a request takes it; one closed or expired meanwhile is
        # dropped when met, and the sweep rebuilds the index from the connections themselves.
        self._idle: dict[Key, dict[int, H1Connection]] = {}

    def create_connection(self, origin: httpcore.Origin) -> H1Connection:
        return H1Connection(origin, self._ssl_context, self._keepalive_expiry, self._socket_options,
                            on_idle=self._went_idle)

    async def aclose(self) -> None:
        self._idle.clear()
        await super().aclose()

    def _went_idle(self, connection: H1Connection) -> None:
        self._idle.setdefault(_key(connection.origin), {})[id(connection)] = connection

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        """httpcore's pass (run on every request and every response closed): give each queued
        request an idle connection to its origin, a new one under ``max_connections``, or a new one
        in place of an idle connection to another origin; close idle connections past
        ``max_keepalive_connections``, the longest idle first. httpcore 1.0's pass walked every
        connection once per idle one; a walk per pass was still 0.2-0.4 ms a request at 500 streams,
        100 ms of the loop when 500 turns start together. This one takes idle connections from its
        index, and walks every connection only every ``SWEEP_SECONDS`` (or once when the pool is
        full): a closed connection leaves the list, and an idle one expired closes, that much later."""
        queued = [request for request in self._requests if request.connection is None]
        now = time.monotonic()
        closing: list[httpcore.AsyncConnectionInterface] = []
        swept = now >= self._next_sweep
        if swept:
            closing += self._sweep(now)
        self._close_past_keep_alive(closing)
        full = False  # no room, and no idle connection to close for it: the rest take idle ones or wait
        for request in queued:
            key = _key(request.request.url.origin)
            chosen = self._take_idle(key, closing)
            if chosen is None and not swept and len(self._connections) >= self._max_connections:
                swept = True  # once a pass: a closed connection may have left room
                closing += self._sweep(now)
                chosen = self._take_idle(key, closing)
            if chosen is None:
                if not full and len(self._connections) >= self._max_connections:
                    full = not self._close_longest_idle(closing)
                if full:
                    continue  # it waits for a connection to come back, as in httpcore
                chosen = self.create_connection(request.request.url.origin)
                self._connections.append(chosen)
            request.assign_to_connection(chosen)
        return closing

    def _take_idle(self, key: Key, closing: list[httpcore.AsyncConnectionInterface]) -> H1Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop(next(iter(idle)))
            if connection.has_expired():
                self._connections.remove(connection)  # rare (a list walk): kept past its expiry
                closing.append(connection)
            elif connection.is_available():
                return connection
        return None

    def _longest_idle(self) -> H1Connection | None:
        """The longest idle connection (to any origin), taken from the index, to close for room; the
        index entries met that are no longer idle are dropped."""
        while True:
            heads = [(next(iter(idle.values())), key) for key, idle in self._idle.items() if idle]
            if not heads:
                return None
            connection, key = min(heads, key=lambda head: head[0].idle_since)
            del self._idle[key][id(connection)]
            if connection.is_available():
                return connection

    def _close_longest_idle(self, closing: list[httpcore.AsyncConnectionInterface]) -> bool:
        """Close the longest idle connection, to any origin; False when there is none."""
        victim = self._longest_idle()
        if victim is None:
            return False
        self._connections.remove(victim)
        closing.append(victim)
        return True

    def _close_past_keep_alive(self, closing: list[httpcore.AsyncConnectionInterface]) -> None:
        surplus = sum(map(len, self._idle.values())) - self._max_keepalive_connections
        while surplus > 0 and self._close_longest_idle(closing):
            surplus -= 1

    def _sweep(self, now: float) -> list[httpcore.AsyncConnectionInterface]:
        """Walk every connection: drop closed ones, close expired ones, index the idle ones no
        request holds (one assigned and not started yet is idle too)."""
        self._next_sweep = now + SWEEP_SECONDS
        held = {id(request.connection) for request in self._requests if request.connection is not None}
        closing: list[httpcore.AsyncConnectionInterface] = []
        kept: list[httpcore.AsyncConnectionInterface] = []
        idle: list[H1Connection] = []
        for connection in self._connections:
            if connection.is_closed():
                continue
            if connection.has_expired():
                closing.append(connection)
                continue
            kept.append(connection)
            if connection.is_available() and id(connection) not in held:
                idle.append(cast(H1Connection, connection))  # create_connection makes no other
        self._connections = kept
        self._idle = {}
        for connection in sorted(idle, key=lambda connection: connection.idle_since):
            self._went_idle(connection)
        return closing


__all__ = ["SWEEP_SECONDS", "FastPool"]
