"""The transport provider streams are read through: httpx's own (``httpx.AsyncHTTPTransport``: its
pool, limits and errors) with HTTP/1.1 parsed in C (``build_transport``: ``pool.FastPool``), and
``LeanBackend``, a lean network backend for httpcore's own h11 connections written on asyncio's
protocol API (the previous read path, kept as the h11 reference the tests and benches compare with).

Why: with 100 paced streams, reading the provider cost about 40 % of the server's CPU, and a third
of that was anyio's socket stream under httpcore, paid on every network read: a cancel scope
(``fail_after``), two exception-mapping context managers, a resource guard, and a
``resume_reading``/``pause_reading`` pair (two epoll changes) around each receive. ``LeanStream``
keeps what arrives in a buffer the protocol fills, so a read whose bytes are already there returns
at once, and a read that must wait arms one timer for its timeout (docs/performance-core.md has the
figures). After that cut, h11 parsing each chunk in pure Python (and httpcore's exception map
around each of its events) was the largest part left: ``h1.py`` parses in C with httptools, on its
own protocol, under the same httpx pool and errors (docs/performance.md, "A C-parsed read path").

It runs on asyncio (uvloop included), which is what uvicorn serves on. With a proxy configured in
the environment, or under another event loop, ``build_transport`` returns None and the caller keeps
httpx's default transport (which honours the proxy).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections import deque
from collections.abc import Iterable
from typing import Any, cast

import httpcore
import httpx

from server.providers.h1_parse import WriteFlow
from server.providers.pool import FastPool

HIGH_WATER = 256 * 1024  # bytes buffered before the socket stops being read (flow control)


class _Protocol(WriteFlow):
    """What the socket delivered and not yet read, and the one read waiting for more."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.eof = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio subclasses

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport: HTTP/1.1 never half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.release_writer()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _expire(future: asyncio.Future[None], error: type[Exception]) -> None:
    if not future.done():
        future.set_exception(error("timed out"))


async def _wait(future: asyncio.Future[None], timeout: float | None, error: type[Exception]) -> None:
    # One timer per read that must wait (none when the bytes are already there); anyio's stream
    # opened a cancel scope for every read.
    loop = asyncio.get_running_loop()
    timer = None if timeout is None else loop.call_later(timeout, _expire, future, error)
    try:
        await future
    finally:
        if timer is not None:
            timer.cancel()


class LeanStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.chunks and not protocol.eof:
            protocol.waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(protocol.waiter, timeout, httpcore.ReadTimeout)
            finally:
                protocol.waiter = None
        if not protocol.chunks:
            if protocol.error is not None:
                raise httpcore.ReadError(str(protocol.error) or type(protocol.error).__name__)
            return b""  # the peer closed the connection
        data = protocol.chunks.popleft()
        if len(data) > max_bytes:
            protocol.chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        protocol.size -= len(data)
        if protocol.size <= HIGH_WATER and not self._transport.is_reading() \
                and not self._transport.is_closing():
            self._transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        if self._protocol.drained is not None:
            await _wait(self._protocol.drained, timeout, httpcore.WriteTimeout)

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                secure = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                              server_hostname=server_hostname)
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        self._protocol.transport = cast(asyncio.Transport, secure)
        return LeanStream(self._protocol.transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle pooled connection the server has closed (or written to)
            return bool(self._protocol.chunks) or self._protocol.eof
        name = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        if name in ("ssl_object", "sockname", "peername", "socket"):
            return self._transport.get_extra_info(name)
        return None


class LeanBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        return await _connect(lambda loop: loop.create_connection(_Protocol, host, port, local_addr=local),
                              timeout, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        return await _connect(lambda loop: loop.create_unix_connection(_Protocol, path), timeout,
                              socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _connect(opener: Any, timeout: float | None, socket_options: Iterable[Any] | None
                   ) -> LeanStream:
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await opener(asyncio.get_running_loop())
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout("connecting timed out") from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc)) from exc
    for option in socket_options or ():
        transport.get_extra_info("socket").setsockopt(*option)
    return LeanStream(transport, protocol)


def build_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport | None:
    """httpx's transport with its pool replaced by ``pool.FastPool`` (httpcore's pool, HTTP/1.1
    connections parsed by httptools); None where httpx's default must stay (a proxy in the
    environment, or an httpx whose transport no longer keeps a connection pool)."""
    if any(scheme != "no" for scheme in urllib.request.getproxies()):  # NO_PROXY alone names none
        return None
    transport = httpx.AsyncHTTPTransport(limits=limits)
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        return None
    transport._pool = FastPool(
        ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry)
    return transport
