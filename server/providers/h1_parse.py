"""An HTTP/1.1 client connection's receiving side, parsed in C by httptools (llhttp) as bytes arrive.

``ResponseReader`` is the asyncio protocol of one provider connection. ``expect(head_only)`` arms
it for the next response; from then on ``data_received`` feeds every byte to llhttp, whose
callbacks fill ``status``/``headers`` and append the body's pieces to ``body``; the reader waiting
in ``h1.py`` is woken when the head is complete, when body bytes arrive, at the end of the message
and at end of file. Nothing here awaits: the protocol is a state machine driven by the event loop.

Contracts:
- ``failure`` holds the first error, a ``RemoteProtocolError`` naming what was wrong (a malformed
  response, a head or chunk/trailer section over ``MAX_OVERHEAD`` bytes, a body cut short), or a
  ``ReadError`` for a socket error; once set, nothing more is parsed.
- A body without a length (no Content-Length, not chunked) ends at end of file, as RFC 9112 6.3
  says; any other body that ends at end of file before its length is a ``RemoteProtocolError``.
- ``reusable()`` is true only after a complete response that allows keep-alive and with nothing
  received beyond it; bytes arriving while no response is expected make the connection stale.
- Body bytes buffered beyond ``HIGH_WATER`` pause reading from the socket until they are taken.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

import httpcore
import httptools

HIGH_WATER = 256 * 1024
# What may arrive that is not body, between two events (the head, a chunk-size line with its
# extensions, the trailers); h11's own bound (max_incomplete_event_size) is the same.
MAX_OVERHEAD = 100 * 1024
_NO_BODY = (204, 304)


class _Beyond(Exception):
    """Raised inside llhttp's callback to stop at the end of the expected response."""


class WriteFlow(asyncio.Protocol):
    """asyncio's write flow control for one connection: ``drained`` is a future while the
    transport's buffer is full, resolved once it empties or the connection is lost."""

    drained: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self.release_writer()
        self.drained = None

    def release_writer(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)


class ResponseReader(WriteFlow):
    """One connection's bytes in, one response at a time out (see the module docstring)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.stale = False  # bytes came while no response was expected
        self.failure: Exception | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._reset(head_only=False)

    def _reset(self, head_only: bool) -> None:
        self.status = 0
        self.reason = b""
        self.http_version = b"HTTP/1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.done = False
        self.keep_alive = False
        self.body: deque[bytes] = deque()
        self.size = 0
        self.paused = False  # reading paused above HIGH_WATER
        self._head_only = head_only
        self._until_eof = False
        self._overhead = 0
        self._event = False
        self._body_fed = 0
        self._fed = 0

    def expect(self, head_only: bool) -> None:
        """Arm for the next response (``head_only`` for a HEAD request: a head and no body)."""
        self._reset(head_only)
        self._parser = httptools.HttpResponseParser(self)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio subclasses

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self.done or self.failure is not None:
            self.stale = True
            self._wake()
            return
        self._event = False
        self._body_fed = 0
        self._fed += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpcore.RemoteProtocolError("the provider switched protocols"))
        except httptools.HttpParserError as exc:
            if self.done:  # bytes beyond the response: it stands, the connection is not reused
                self.stale = True
            else:
                self._fail(httpcore.RemoteProtocolError(f"malformed HTTP response: {exc}"))
        else:  # what the read held besides body bytes (chunk heads, the head), bounded
            overhead = len(data) - self._body_fed
            self._overhead = overhead if self._event else self._overhead + overhead
            if self._overhead > MAX_OVERHEAD and not self.done:
                self._overhead_too_large()
        if self.size > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True  # the taker resumes it (h1.py); a flag, not a transport call per take
        waiter = self.waiter  # _wake, written out: this runs once per network read
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # close the transport: HTTP/1.1 never half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)
        self.release_writer()

    # llhttp's callbacks (called from feed_data)

    def on_message_begin(self) -> None:
        if self.done:
            raise _Beyond  # a second response to one request: stop parsing here
        self._event = True

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # later ones are trailers, which the response does not carry
            self.headers.append((name, value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        parser = cast(httptools.HttpResponseParser, self._parser)
        self._event = True
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim response: the real one follows
            self.reason, self.headers = b"", []
            return
        self.status, self.head_done = status, True
        version = parser.get_http_version()
        self.http_version = b"HTTP/" + version.encode("ascii")
        # HTTP/1.0 keep-alive is not kept, as h11 (httpx's parser) does not keep it
        self.keep_alive = version == "1.1" and parser.should_keep_alive()
        if self._head_only:
            # llhttp would wait for the body a HEAD response has not; the next request gets a
            # parser of its own, and bytes before it make the connection stale.
            self.done = True
        else:
            self._until_eof = status not in _NO_BODY and not self._has_length()

    def on_body(self, body: bytes) -> None:
        if self.done:  # a HEAD response's "body": bytes no response should carry
            self.stale = True
            return
        self.body.append(body)
        self.size += len(body)
        self._body_fed += len(body)

    def on_chunk_complete(self) -> None:
        self._event = True

    def on_message_complete(self) -> None:
        self._event = True
        if self.head_done:
            self.done = True

    # helpers

    def _has_length(self) -> bool:
        coding = b""
        length = False
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                coding = value.lower()
            elif lowered == b"content-length":
                length = True
        if coding:
            return coding.rsplit(b",", 1)[-1].strip() == b"chunked"
        return length

    def _overhead_too_large(self) -> None:
        what = "chunk header or trailer" if self.head_done else "response head"
        self._fail(httpcore.RemoteProtocolError(f"{what} larger than {MAX_OVERHEAD} bytes"))

    def _ended(self, exc: Exception | None) -> None:
        self.eof = True
        if self._parser is not None and not self.done and self.failure is None:
            if self.head_done and self._until_eof and exc is None:
                self.done, self.keep_alive = True, False
            elif exc is not None:
                self._fail(httpcore.ReadError(str(exc) or type(exc).__name__))
            elif self._fed == 0:
                self._fail(httpcore.RemoteProtocolError("Server disconnected without sending a response."))
            elif not self.head_done:
                self._fail(httpcore.RemoteProtocolError(
                    "Server disconnected in the middle of the response head."))
            else:
                self._fail(httpcore.RemoteProtocolError(
                    "peer closed connection without sending complete message body"))
        self._wake()

    def _fail(self, error: Exception) -> None:
        if self.failure is None:
            self.failure = error
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.stale and not self.eof \
            and self.failure is None
