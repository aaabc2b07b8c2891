"""server.web.accept: every connection waiting on the listening socket is taken at one wake-up, on
a real uvloop loop with real sockets on loopback."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import pytest
import uvloop

from server.web import accept
from server.web.accept import BatchAcceptor, accepts_one_per_wakeup, take_over
from tests.support import iterations_until

BURST = 60


class Opened(asyncio.Protocol):
    def __init__(self, made: list[asyncio.BaseTransport], all_made: asyncio.Event | None = None,
                 wanted: int = 0) -> None:
        self.made, self.all_made, self.wanted = made, all_made, wanted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)
        if self.all_made is not None and len(self.made) == self.wanted:
            self.all_made.set()


@contextmanager
def clients(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that the kernel has completed and queued for accept."""
    made = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    try:
        yield made
    finally:
        for sock in made:
            sock.close()


Serving = tuple[int, Callable[[], object]]  # the port, and what stops accepting


async def burst_iterations(serve: Callable[[asyncio.AbstractEventLoop, list[asyncio.BaseTransport]],
                                           Awaitable[Serving]]) -> int:
    loop = asyncio.get_running_loop()
    made: list[asyncio.BaseTransport] = []
    port, stop = await serve(loop, made)
    try:
        with clients(port, BURST):
            n = await iterations_until(loop, lambda: len(made) == BURST, most=10 * BURST)
        assert len(made) == BURST
        return n
    finally:
        stop()
        for transport in made:
            transport.close()


async def uvloop_server(loop: asyncio.AbstractEventLoop, made: list[asyncio.BaseTransport]) -> Serving:
    server = await loop.create_server(lambda: Opened(made), "127.0.0.1", 0, backlog=BURST * 2)
    return server.sockets[0].getsockname()[1], server.close


async def taken_over(loop: asyncio.AbstractEventLoop, made: list[asyncio.BaseTransport]) -> Serving:
    server = await loop.create_server(lambda: Opened(made), "127.0.0.1", 0, backlog=BURST * 2)
    port = server.sockets[0].getsockname()[1]
    acceptors = take_over(loop, server, lambda: Opened(made))
    return port, lambda: [acceptor.close() for acceptor in acceptors]


def test_accept_takes_a_burst_at_one_wakeup():
    taken = uvloop.run(burst_iterations(taken_over))
    # Accepting the batch, then each connection's task and its connection_made: a few iterations.
    assert taken <= 4, taken


def test_accept_uvloop_alone_takes_one_connection_per_iteration():
    # Why server.web.accept exists: the day uvloop's own server takes a burst at once, it can go.
    alone = uvloop.run(burst_iterations(uvloop_server))
    assert alone >= BURST // 2, alone


def test_accept_is_only_taken_over_where_the_loop_accepts_one_at_a_time():
    for new_loop, one_at_a_time in ((uvloop.new_event_loop, True), (asyncio.new_event_loop, False)):
        loop = new_loop()
        try:
            assert accepts_one_per_wakeup(loop) is one_at_a_time
        finally:
            loop.close()


def test_accept_close_stops_accepting_and_closes_the_socket():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        port, stop = await taken_over(loop, made)
        stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)

    uvloop.run(main())


def test_accept_connections_taken_before_close_reach_their_protocol():
    # A shutdown closes the acceptor, waits for what it took (opened), then tells every connection
    # to end: none may reach uvicorn after that.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        listening = socket.create_server(("127.0.0.1", 0))
        acceptor = BatchAcceptor(loop, listening, lambda: Opened(made))
        listening.close()
        with clients(acceptor.sock.getsockname()[1], 3):
            acceptor._ready()  # what the loop calls when the socket is readable
            acceptor.close()
            assert not made  # accepted, their protocols not made yet
            await acceptor.opened()
            assert len(made) == 3
        for transport in made:
            transport.close()

    uvloop.run(main())


def test_accept_out_of_descriptors_pauses_and_resumes(monkeypatch, caplog):
    # EMFILE leaves the connection queued and the socket readable: accepting must pause rather
    # than spin on it, and take the connection once descriptors are free again.
    monkeypatch.setattr(accept, "RETRY_SECONDS", 0.05)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        all_made = asyncio.Event()
        listening = socket.create_server(("127.0.0.1", 0))
        acceptor = BatchAcceptor(loop, listening, lambda: Opened(made, all_made, 3))
        listening.close()
        acceptor.start()
        port = acceptor.sock.getsockname()[1]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with clients(port, 3):
            lowest_free = os.dup(0)  # descriptors may have gaps: a limit at the lowest free one leaves none
            os.close(lowest_free)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
            try:
                acceptor._ready()  # what the loop calls when the socket is readable
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert not acceptor.accepting and acceptor.retry is not None and not made
            await asyncio.wait_for(all_made.wait(), 5)  # the retry, 50 ms on
            assert acceptor.accepting
        acceptor.close()
        for transport in made:
            transport.close()

    with caplog.at_level("ERROR", logger="server.web.accept"):
        uvloop.run(main())
    assert "accepting pauses" in caplog.text
