"""HTTP/1.1 connections for httpcore's pool whose responses are parsed in C (``h1_parse.py``).

``pool.FastPool`` is httpcore's ``AsyncConnectionPool`` (so httpx's client, limits, pool timeout and
keep-alive expiry stay as they are) whose ``create_connection`` returns an ``H1Connection``: one
TCP (or TLS) connection on asyncio's protocol API that writes each request itself and hands the
response body on as it came: what arrived since the reader last took is one piece (a reader that
keeps up gets one piece per network read, one that fell behind gets them joined).

Contracts, the same as httpcore's ``AsyncHTTP11Connection`` over ``AsyncHTTPConnection``:
- errors are httpcore's (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
  ``WriteTimeout``, ``WriteError``, ``RemoteProtocolError``, ``LocalProtocolError``), which httpx
  maps to its own; the request's ``timeout`` extension gives connect, read (each wait for bytes)
  and write (each wait for the socket to drain);
- a connection goes back to the pool only after its response was read to the end and allowed
  keep-alive; a response closed early, or any failure, closes it;
- ``has_expired`` is true past ``keepalive_expiry`` of idleness, or when an idle connection's peer
  closed it or sent anything.
``H1Body.parts`` (the response names its body in its extensions under ``BODY``) reads the body
past httpx's and httpcore's stream wrappers, its errors mapped to httpx's as httpx maps them.
Only HTTP/1.1 is spoken (ALPN offers nothing else); no trace extension, no upgrade, no CONNECT:
with a proxy in the environment ``transport.build_transport`` keeps httpx's default transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

import httpcore
from httpx._transports.default import map_httpcore_exceptions

from server.providers.h1_parse import HIGH_WATER, ResponseReader

_WRITE_BATCH = 64 * 1024
# The response extension naming its ``H1Body`` (httpcore's pool and httpx's transport pass a
# response's extensions on), for a reader that iterates ``H1Body.parts`` directly.
BODY = "meterchat.h1_body"
# The trace event (httpcore's ``trace`` request extension) once the whole request is written: the name
# httpcore's own HTTP/1.1 connection gives it, so one callback serves both read paths.
REQUEST_SENT = "http11.send_request_body.complete"
_BAD_FIELD = re.compile(rb"[\r\n\x00]")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class _State(enum.IntEnum):
    NEW = 0
    ACTIVE = 1
    IDLE = 2
    CLOSED = 3


def _expire(future: asyncio.Future[None], error: type[Exception]) -> None:
    if not future.done():
        future.set_exception(error("timed out"))


async def _wait(future: asyncio.Future[None], timeout: float | None, error: type[Exception]) -> None:
    # One timer per wait that must happen; a read whose bytes are there already arms none.
    timer = None if timeout is None else asyncio.get_running_loop().call_later(
        timeout, _expire, future, error)
    try:
        await future
    finally:
        if timer is not None:
            timer.cancel()


class ReadDeadline:
    """The read timeout of one connection's waits with one timer, moved lazily: each wait sets the
    deadline; the timer, firing before the deadline a later wait set, re-arms for it. (A stream
    waits once per chunk: a timer armed and cancelled per wait was a twentieth of the server's
    CPU at 100 paced sessions.)"""

    def __init__(self, reader: ResponseReader) -> None:
        self._reader = reader
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the armed timer fires
        self._deadline = 0.0  # when the current wait times out

    def arm(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._deadline = deadline = loop.time() + timeout
        if self._timer is not None and self._at <= deadline:
            return  # it fires first and moves on to this deadline
        self.cancel()
        self._at, self._timer = deadline, loop.call_at(deadline, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        waiter = self._reader.waiter
        if waiter is None or waiter.done():
            return  # no wait now; the next one arms again
        if loop.time() >= self._deadline:
            waiter.set_exception(httpcore.ReadTimeout("timed out"))
        else:
            self._at, self._timer = self._deadline, loop.call_at(self._deadline, self._fire, loop)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def request_head(request: httpcore.Request) -> bytes:
    """The request line and header fields; ``LocalProtocolError`` for what would break framing."""
    if not _TOKEN.fullmatch(request.method):
        raise httpcore.LocalProtocolError(f"invalid method {request.method!r}")
    target = request.url.target
    if not target or b" " in target or _BAD_FIELD.search(target):
        raise httpcore.LocalProtocolError(f"invalid request target {target!r}")
    lines = [request.method + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers:
        if not _TOKEN.fullmatch(name) or _BAD_FIELD.search(value):
            raise httpcore.LocalProtocolError(f"invalid header {name!r}")
        lines.append(name + b": " + value)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)


def _chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
               for name, value in headers)


class H1Connection(httpcore.AsyncConnectionInterface):
    """One origin, one socket, one request at a time (see the module docstring)."""

    def __init__(self, origin: httpcore.Origin, ssl_context: ssl.SSLContext | None,
                 keepalive_expiry: float | None, socket_options: Iterable[Any] | None = None,
                 on_idle: Callable[[H1Connection], None] | None = None) -> None:
        self._origin = origin
        self._on_idle = on_idle  # told each time a response closes and the connection is kept
        self.idle_since = 0.0  # monotonic time it last went idle
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._socket_options = socket_options
        self._state = _State.NEW
        self._expire_at: float | None = None
        self._requests = 0
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader = ResponseReader()
        self._read_deadline = ReadDeadline(self._reader)
        self._connect_failed = False

    # the pool's interface

    @property
    def origin(self) -> httpcore.Origin:
        return self._origin

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return origin == self._origin

    def is_available(self) -> bool:
        # NEW: a connection whose request was cancelled before it started holds no socket yet; the
        # next request may take it (in httpcore it kept a max_connections place for good).
        return self._state == _State.IDLE or (self._state == _State.NEW and not self._connect_failed)

    def has_expired(self) -> bool:
        if self._state == _State.NEW:
            return self._connect_failed
        if self._state != _State.IDLE:
            return False
        expired = self._expire_at is not None and time.monotonic() > self._expire_at
        return expired or self._reader.stale or self._reader.eof

    def is_idle(self) -> bool:
        return self._state == _State.IDLE or self._connect_failed

    def is_closed(self) -> bool:
        return self._state == _State.CLOSED or self._connect_failed

    def info(self) -> str:
        return f"{str(self._origin)!r}, HTTP/1.1 (httptools), {self._state.name}, " \
               f"Request Count: {self._requests}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.info()}]>"

    async def aclose(self) -> None:
        self._state = _State.CLOSED
        self._read_deadline.cancel()
        if self._transport is not None:
            self._transport.close()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        trace = request.extensions.get("trace")
        if not self.can_handle_request(request.url.origin):
            raise RuntimeError(f"request to {request.url.origin} on a connection to {self._origin}")
        if self._state not in (_State.NEW, _State.IDLE):
            raise httpcore.ConnectionNotAvailable()
        timeouts = request.extensions.get("timeout", {})
        new = self._state == _State.NEW
        self._state, self._expire_at = _State.ACTIVE, None
        self._requests += 1
        try:
            if new:
                await self._connect(request, timeouts.get("connect"))
            self._reader.expect(head_only=request.method == b"HEAD")
            try:
                await self._send(request, timeouts.get("write"))
            except httpcore.WriteError:
                pass  # as httpcore does: a server may answer (a 413) and close before reading it all
            else:
                if trace is not None:  # httpcore's trace extension, at the event its h11 path names so
                    await trace(REQUEST_SENT, {"request": request})
            await self._head(timeouts.get("read"))
        except BaseException:
            await self.aclose()
            raise
        reader = self._reader
        body = H1Body(self, timeouts.get("read"))
        return httpcore.Response(
            status=reader.status, headers=reader.headers, content=body,
            extensions={"http_version": reader.http_version, "reason_phrase": reader.reason, BODY: body})

    # connecting, writing, reading the head

    async def _connect(self, request: httpcore.Request, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        host, port = self._origin.host.decode("ascii"), self._origin.port
        context = None
        if self._origin.scheme in (b"https", b"wss"):
            context = self._ssl_context or ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
        sni = request.extensions.get("sni_hostname") or host if context else None
        try:
            async with asyncio.timeout(timeout):
                transport, _ = await loop.create_connection(lambda: self._reader, host, port,
                                                            ssl=context, server_hostname=sni)
        except TimeoutError as exc:
            self._connect_failed = True
            raise httpcore.ConnectTimeout("connecting timed out") from exc
        except OSError as exc:  # ssl.SSLError included: a failed handshake is a failed connect
            self._connect_failed = True
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            self._connect_failed = True
            raise
        self._transport = transport
        self._loop = loop  # asyncio.get_running_loop() is a getpid() system call on 3.11: once here
        for option in self._socket_options or ():
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(*option)

    async def _send(self, request: httpcore.Request, timeout: float | None) -> None:
        pending = [request_head(request)]
        size = len(pending[0])
        chunked = _chunked(request.headers)
        assert isinstance(request.stream, AsyncIterable)
        async for part in request.stream:
            if not part:
                continue
            if chunked:
                part = b"%x\r\n%b\r\n" % (len(part), part)
            pending.append(part)
            size += len(part)
            if size >= _WRITE_BATCH:
                await self._write(b"".join(pending), timeout)
                pending, size = [], 0
        if chunked:
            pending.append(b"0\r\n\r\n")
        await self._write(b"".join(pending), timeout)

    async def _write(self, data: bytes, timeout: float | None) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        transport.write(data)  # one send for the whole request when it fits the socket buffer
        if self._reader.drained is not None:
            await _wait(self._reader.drained, timeout, httpcore.WriteTimeout)

    async def _head(self, timeout: float | None) -> None:
        reader = self._reader
        while not reader.head_done:
            if reader.failure is not None:
                raise reader.failure
            await self.wait(timeout)

    async def wait(self, timeout: float | None) -> None:
        """Until the reader has news (bytes, the end, a failure); ``ReadTimeout`` after ``timeout``."""
        reader, loop = self._reader, self._loop or asyncio.get_running_loop()
        waiter = reader.waiter = loop.create_future()
        if timeout is not None:
            self._read_deadline.arm(loop, timeout)
        try:
            await waiter
        finally:
            reader.waiter = None

    def take(self) -> bytes:
        """The body bytes llhttp handed over since the last take, joined (a reader that fell behind
        gets them in one piece: one pass through the layers above per wake-up, not one per chunk
        of a chunked body); reading resumes below the high water."""
        reader = self._reader
        body = reader.body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        reader.size = 0
        if reader.paused:
            reader.paused = False
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
        return data

    async def response_closed(self) -> None:
        if self._state == _State.ACTIVE and self._reader.reusable():
            self._state = _State.IDLE
            self.idle_since = now = time.monotonic()
            if self._keepalive_expiry is not None:
                self._expire_at = now + self._keepalive_expiry
            if self._on_idle is not None:
                self._on_idle(self)
        else:
            await self.aclose()


class H1Body:
    """The response body as httpcore's pool iterates it; closing gives the connection back."""

    def __init__(self, connection: H1Connection, timeout: float | None) -> None:
        self._connection = connection
        self._timeout = timeout
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._read(mapped=False)

    def parts(self) -> AsyncIterator[bytes]:
        """The body as httpx's ``response.aiter_raw()`` gives it, past the four generators httpx
        and httpcore wrap around it (a hop each per piece); failures become httpx's errors as
        httpx maps them. Closing stays httpx's: ``response.aclose()`` reaches this body."""
        return self._read(mapped=True)

    async def _read(self, mapped: bool) -> AsyncIterator[bytes]:
        # One generator for both ways in: parts() wrapping __aiter__ was one more hop per piece.
        connection, reader = self._connection, self._connection._reader
        with map_httpcore_exceptions() if mapped else contextlib.nullcontext():
            try:
                while True:
                    if reader.body:
                        yield connection.take()
                    elif reader.done:
                        break
                    elif reader.failure is not None:
                        raise reader.failure
                    else:
                        await connection.wait(self._timeout)
            except BaseException:
                await self.aclose()
                raise

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._connection.response_closed()


__all__ = ["BODY", "HIGH_WATER", "H1Body", "H1Connection", "request_head"]
