"""How ``meterchat`` serves: uvicorn's options read from ``[server]``, a deadline on request heads,
and a shutdown that drains the app before uvicorn closes the sockets.

uvicorn times out an idle kept-alive connection only after a response, and never a request head
that trickles in a byte at a time (slowloris); ``guarded_http`` arms a timer whenever a connection
waits for a head (when it opens, and after each response) and closes the transport if the head has
not arrived when it fires. A connection upgraded to a WebSocket is past its head and left alone.

Every log line passes ``RedactLogs`` on its way out: libraries log what they were given (httpx logs
each request's URL, ``user:pass@`` included), and the log must hold no credential or provider key.

On SIGTERM ``DrainingServer`` first awaits the app's ``state.drain`` (set by its lifespan: end the
``/events`` streams, stop and store every streaming reply), then stops accepting and lets uvicorn
close the connections (1012 for WebSockets) with what is left of ``shutdown_grace_seconds``.

Before it starts it also settles the heap (``settle_heap``): what start-up built (modules,
settings, the app) is moved out of the cyclic collector's reach and the youngest generation is collected
less often. Measured (docs/performance.md, "Per-chunk work"): at 300 streaming sessions the
collector took a tenth of the server's CPU and its full passes over about 250,000 objects paused
the loop for 0.2-0.3 s each; nearly nothing it found was garbage (replies are acyclic).

Under uvloop (and without TLS) it then takes over uvicorn's listening sockets (``server.web.accept``),
so a burst of connections is accepted at the next wake-up rather than one per loop iteration.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.config.settings import ServerSettings
from server.providers.redact import redact
from server.web.accept import BatchAcceptor, accepts_one_per_wakeup, take_over

# The handlers of the root logger (the app's and libraries' lines) and of uvicorn's error log. The
# access log has its own handler and server.web.access's ?token= redaction: a request line names a path
# of this server, never a provider's URL or key.
LOGGERS = ("", "uvicorn", "uvicorn.error")

HTTP_HEADROOM = 256  # connections beyond max_connections kept for the page, /api and /events
MIN_CLOSE_SECONDS = 1  # what uvicorn gets to close sockets however long the drain took
# Net new container objects between two collections of the youngest generation (CPython's default
# is 700: a collection every ~50 chunks, each walking whatever in-flight frames, packets and
# events were alive at that moment). The older generations keep their defaults.
GC_YOUNG_THRESHOLD = 10_000


def uvicorn_options(server: ServerSettings) -> dict[str, Any]:
    """The ``uvicorn.Config`` options that bound connections, heads and shutdown."""
    return {
        "http": guarded_http(server.header_timeout_seconds, server.max_header_bytes),
        "h11_max_incomplete_event_size": server.max_header_bytes,
        "limit_concurrency": server.max_connections + HTTP_HEADROOM,
        "timeout_graceful_shutdown": math.ceil(server.shutdown_grace_seconds),
    }


def guarded_http(head_timeout: float, max_head_bytes: int) -> type[asyncio.Protocol]:
    """The HTTP protocol uvicorn would pick (httptools where installed, else h11) with a deadline
    on every request head; httptools also gets the head size bound h11 has built in."""
    try:
        return guarded_httptools(head_timeout, max_head_bytes)
    except ImportError:  # no httptools here (pyproject installs it where it builds)
        return guarded_h11(head_timeout)


class HeadDeadline:
    """The timer on one connection's next request head: armed when the connection opens and after
    each response, cancelled when it closes; ``overdue`` decides whether the head is still awaited."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, overdue: Callable[[], None]) -> None:
        self.loop, self.seconds, self.overdue = loop, seconds, overdue
        self.timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self.cancel()
        self.timer = self.loop.call_later(self.seconds, self.overdue)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def guarded_h11(head_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on every request head."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._deadline = HeadDeadline(self.loop, head_timeout, self._head_overdue)
            self._deadline.arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._deadline.arm()  # a kept-alive connection waits for its next head under the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

        def _head_overdue(self) -> None:
            # IDLE on the client's side: no complete head since the connection opened or the last
            # response ended (an upgraded or busy connection has left IDLE).
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def guarded_httptools(head_timeout: float, max_head_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline and a size bound on every request head."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # needs httptools

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_bytes: int | None = None  # bytes of the head awaited so far; None once it arrived

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._deadline = HeadDeadline(self.loop, head_timeout, self._head_overdue)
            self._await_head()

        def data_received(self, data: bytes) -> None:
            # Parsed first, counted after: one read may carry a whole head and the start of its body
            # (a proxy writes both at once), and only a head still incomplete is held to the bound.
            waiting = self._head_bytes is not None
            super().data_received(data)
            if waiting and self._head_bytes is not None:
                self._head_bytes += len(data)
                if self._head_bytes > max_head_bytes and not self.transport.is_closing():
                    self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_bytes = None
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_head()  # a kept-alive connection waits for its next head under the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline.cancel()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            self._head_bytes = 0
            self._deadline.arm()

        def _head_overdue(self) -> None:
            if self._head_bytes is not None and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol


class RedactLogs(logging.Filter):
    """Keys, tokens and ``user:pass@`` in a record's message and arguments become ``***``. The
    arguments are redacted one by one, not merged into the message: uvicorn's access formatter
    reads them by position."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [secret for secret in secrets if secret]

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        if isinstance(record.args, tuple):
            record.args = tuple(self._clean(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: self._clean(value) for key, value in record.args.items()}
        return True

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return redact(value, self.secrets)
        if isinstance(value, (int, float, bool)) or value is None:
            return value
        text = str(value)  # an object logged with %s (httpx logs the request's URL object)
        clean = redact(text, self.secrets)
        return value if clean == text else clean


def redact_logs(secrets: Iterable[str]) -> None:
    """Put ``RedactLogs`` on every handler (after uvicorn has configured its loggers)."""
    guard = RedactLogs(secrets)
    for name in LOGGERS:
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(guard)


def settle_heap() -> None:
    """Freeze what start-up allocated (it lives as long as the process; a full collection no
    longer walks it) and collect the young generation less often. Bounded: a cycle is still found
    within ``GC_YOUNG_THRESHOLD`` allocations, and every full pass still runs."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    logging.getLogger(__name__).info(
        "heap settled: %d start-up objects frozen; young generation collected every %d allocations",
        gc.get_freeze_count(), GC_YOUNG_THRESHOLD)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self.app = app
        self.acceptors: list[BatchAcceptor] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        settle_heap()  # the app is built and every module imported; the lifespan's services are not
        await super().startup(sockets)
        loop = asyncio.get_running_loop()
        if self.started and accepts_one_per_wakeup(loop) and not self.config.ssl:  # TLS: uvloop's own
            self.acceptors = [acceptor for server in self.servers
                              for acceptor in take_over(loop, server, self._new_protocol)]

    def _new_protocol(self) -> asyncio.Protocol:
        """What uvicorn's own server makes for each connection (``Server.startup``'s factory)."""
        config = self.config
        make: Any = config.http_protocol_class  # typed as asyncio.Protocol, whose __init__ takes nothing
        protocol: asyncio.Protocol = make(config=config, server_state=self.server_state,
                                          app_state=self.lifespan.state)
        return protocol

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown or 0.0
        started = time.monotonic()
        drain = getattr(self.app.state, "drain", None)
        if drain is not None:
            await drain(grace)
        for acceptor in self.acceptors:  # where uvicorn stops accepting: the start of its shutdown
            acceptor.close()
        for acceptor in self.acceptors:
            await acceptor.opened()
        left = grace - (time.monotonic() - started)
        # uvicorn's setting is whole seconds: round up, so the grace is never cut short.
        self.config.timeout_graceful_shutdown = math.ceil(max(MIN_CLOSE_SECONDS, left))
        await super().shutdown(sockets)
