"""``FastPool``: httpcore's connection pool (so httpx's client, its limits, pool timeout, keep-alive
expiry and errors stay as they are) whose connections are ``h1.H1Connection`` (responses parsed in
C), and whose assignment pass is linear in the connections and requests it holds (see
``FastPool._assign_requests_to_connections``).
"""

from __future__ import annotations

import collections
import time
from typing import cast

import httpcore
from httpcore._async.connection_pool import AsyncPoolRequest

from server.providers.h1 import H1Connection

SWEEP_SECONDS = 0.25  # how often a pass with no request waiting drops closed connections


def _key(origin: httpcore.Origin) -> tuple[bytes, bytes, int]:
    return origin.scheme, origin.host, origin.port  # httpcore's Origin is not hashable


class FastPool(httpcore.AsyncConnectionPool):
    """httpcore's pool, its connections ``H1Connection``, its assignment pass linear."""

    _next_sweep = 0.0  # monotonic time of the next sweep a pass with no queued request makes

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        return H1Connection(origin, self._ssl_context, self._keepalive_expiry, self._socket_options)

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        """httpcore's pass (run on every request and every response closed): drop closed
        connections, close expired ones and idle ones past ``max_keepalive_connections``, then give
        each queued request an idle connection to its origin, a new one under ``max_connections``,
        or a new one in place of an idle connection to another origin. httpcore 1.0's pass counts
        the connections once per idle connection (quadratic: at 500 streams a third of the
        server's CPU went there as they ended) and compares that count, not the idle one, with the
        keep-alive bound. This one walks each list once, and never hands a connection that a
        request holds but has not started on yet (or one it gave in this pass) to another. A pass
        with no request waiting (a response closed) sweeps only every ``SWEEP_SECONDS``, or when
        the pool holds more than the keep-alive bound: an expired connection waits that long to
        close, and a free one is found by the next request's pass."""
        queued: list[AsyncPoolRequest] = []
        held: set[int] = set()  # connections a request holds (ACTIVE, or assigned and not started)
        for request in self._requests:
            if request.connection is None:  # httpcore's is_queued()
                queued.append(request)
            else:
                held.add(id(request.connection))
        now = time.monotonic()
        crowded = len(self._connections) > self._max_keepalive_connections
        if not queued and not crowded and now < self._next_sweep:
            return []
        self._next_sweep = now + SWEEP_SECONDS
        closing: list[httpcore.AsyncConnectionInterface] = []
        kept: list[httpcore.AsyncConnectionInterface] = []
        idle: list[httpcore.AsyncConnectionInterface] = []
        for connection in self._connections:
            if connection.is_closed():
                continue
            if connection.has_expired():
                closing.append(connection)
            else:
                kept.append(connection)
                if connection.is_idle():
                    idle.append(connection)
        surplus = len(idle) - self._max_keepalive_connections
        if surplus > 0:  # the longest kept first, as httpcore's walk closes them
            gone = {id(connection) for connection in idle[:surplus]}
            closing += idle[:surplus]
            idle = idle[surplus:]
            kept = [connection for connection in kept if id(connection) not in gone]
        self._connections = kept
        if not queued:
            return closing
        spare = {id(c): c for c in idle if id(c) not in held}  # idle, nobody's: may close for room
        free: dict[tuple[bytes, bytes, int], collections.deque[httpcore.AsyncConnectionInterface]] = {}
        for connection in spare.values():
            if connection.is_available():
                free.setdefault(_key(cast(H1Connection, connection).origin),
                                collections.deque()).append(connection)
        for request in queued:
            origin = request.request.url.origin
            reuse, chosen = free.get(_key(origin)), None
            while reuse and chosen is None:
                chosen = spare.pop(id(reuse.popleft()), None)  # None: closed for room already
            if chosen is None:
                if len(self._connections) >= self._max_connections:
                    if not spare:
                        continue  # it waits for a connection to come back, as in httpcore
                    victim = spare.pop(next(iter(spare)))
                    self._connections.remove(victim)
                    closing.append(victim)
                chosen = self.create_connection(origin)
                self._connections.append(chosen)
            request.assign_to_connection(chosen)
        return closing


__all__ = ["SWEEP_SECONDS", "FastPool"]
