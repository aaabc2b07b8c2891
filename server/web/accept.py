"""Every connection waiting on the listening socket taken at each wake-up of the loop.

libuv (uvloop's core) accepts one connection each time the listening socket is reported readable,
that is once per loop iteration. Under load an iteration runs hundreds of stream callbacks, so a
burst of connections waits in the kernel's accept queue: with 300 streams running, 100 connections
made at once took 0.56-1.33 s to be accepted, where asyncio's selector loop, which accepts up to
the backlog per wake-up, took under 0.02 s (docs/performance.md, "The provider pool's pass and the
load bench's opens").

``BatchAcceptor`` takes over the socket uvicorn listens on: it stops the loop's own server and
accepts up to ``BATCH`` connections per wake-up itself, handing each to
``loop.connect_accepted_socket`` with uvicorn's protocol factory. Connections are still uvicorn's:
its protocol tracks them, bounds them (``limit_concurrency``) and shuts them down; only the accept
is ours. ``close`` stops accepting, as closing uvicorn's server would; ``opened`` waits for the
connections accepted before it to reach uvicorn, which then shuts them down with the rest.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

BATCH = 128  # connections accepted per wake-up: a burst is taken at once, a flood cannot hold the loop
RETRY_SECONDS = 1.0  # out of descriptors or memory: accepting pauses this long (asyncio's own delay)
# Errors that say the process or the system is out of something: the connection stays queued in the
# kernel and accepting resumes later, rather than spinning on a socket that stays readable.
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def accepts_one_per_wakeup(loop: asyncio.AbstractEventLoop) -> bool:
    """True for uvloop, whose libuv accepts one connection per loop iteration."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


class BatchAcceptor:
    """Accepts on one listening socket (a duplicate of the descriptor the loop's server had) and
    gives each connection to ``protocol_factory`` through the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, listening: socket.socket,
                 protocol_factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self.loop, self.protocol_factory = loop, protocol_factory
        self.sock = socket.socket(fileno=os.dup(listening.fileno()))
        self.sock.setblocking(False)
        self.opening: set[asyncio.Task[object]] = set()
        self.accepting = False
        self.retry: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.retry = None
        if self.sock.fileno() != -1:
            self.loop.add_reader(self.sock, self._ready)
            self.accepting = True

    def close(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
        if self.accepting:
            self.loop.remove_reader(self.sock)
            self.accepting = False
        self.sock.close()

    def _ready(self) -> None:
        for _ in range(BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                self._pause(exc)
                return
            self._open(conn)

    def _open(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        task = self.loop.create_task(self._connect(conn))
        self.opening.add(task)
        task.add_done_callback(self.opening.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol_factory, conn)
        except OSError as exc:  # the client went away between accept and the transport's start
            log.debug("an accepted connection closed before it opened: %s", exc)
            conn.close()
        except Exception:  # a bug must cost one connection, never the acceptor
            log.exception("an accepted connection could not be opened")
            conn.close()

    async def opened(self) -> None:
        """Wait until every connection accepted so far has its protocol (after ``close``: so a
        shutdown that tells each connection to end reaches all of them)."""
        if self.opening:
            await asyncio.gather(*self.opening, return_exceptions=True)

    def _pause(self, exc: OSError) -> None:
        if exc.errno not in EXHAUSTED:
            log.error("accept failed: %s", exc)
            return
        log.error("accept failed (%s): accepting pauses for %.0f s", exc, RETRY_SECONDS)
        self.loop.remove_reader(self.sock)
        self.accepting = False
        self.retry = self.loop.call_later(RETRY_SECONDS, self.start)


def take_over(loop: asyncio.AbstractEventLoop, server: asyncio.AbstractServer,
              protocol_factory: Callable[[], asyncio.BaseProtocol]) -> list[BatchAcceptor]:
    """Start a ``BatchAcceptor`` on each socket of ``server``, then close ``server``: the listening
    sockets live on in the acceptors' duplicates, and connections queued meanwhile wait in the
    kernel for the first wake-up."""
    acceptors = [BatchAcceptor(loop, listening, protocol_factory)
                 for listening in getattr(server, "sockets", ())]
    server.close()
    for acceptor in acceptors:
        acceptor.start()
    return acceptors
