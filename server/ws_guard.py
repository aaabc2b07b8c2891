"""The WebSocket protocol ``meterchat`` serves with: uvicorn's sans-I/O websockets protocol with a
lingering close after a frame it refuses.

A frame over ``ws_max_size`` (or one that breaks the protocol) makes websockets fail the connection
with a close frame (1009 "over size limit", 1002, 1007). uvicorn then writes that frame and closes
the socket at once, while the rest of the refused frame (megabytes) is still unread in the kernel:
closing a socket with unread data sends a TCP reset, and a reset makes the client's kernel drop
what it had not yet read, the close frame included. The client saw a dropped connection where the
protocol promises an answer.

``LingeringWebSocketProtocol`` closes the way RFC 6455 7.1.1 and HTTP servers do it: it writes the
close frame, half-closes its side (FIN, so the client reads the frame and then the end), stops
feeding the parser and drops whatever still arrives, and closes when the peer closes or after
``linger_seconds``, whichever comes first. A peer that keeps sending costs a read and a discard
per chunk, never memory, and no longer than the linger.
"""

from __future__ import annotations

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

LINGER_SECONDS = 3.0  # long enough for a 20 MiB frame over a slow LAN link, short for a held socket


class LingeringWebSocketProtocol(WebSocketsSansIOProtocol):
    linger_seconds = LINGER_SECONDS
    lingering = False  # a close frame was sent on a failed connection; input is dropped

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the rest of a refused frame, or anything after it: read so it cannot reset
        super().data_received(data)

    def handle_parser_exception(self) -> None:
        close = self.conn.close_sent
        assert close is not None  # websockets' fail() sent one before this is called
        self.queue.put_nowait({"type": "websocket.disconnect", "code": close.code, "reason": close.reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the close frame, then the end of stream
        if self.read_paused:  # paused while the app held a message: the discard must go on reading
            self.read_paused = False
            self.transport.resume_reading()
        # run_asgi leaves the transport open while a close timer is pending; connection_lost (the
        # peer closed: eof_received returns None, so asyncio closes) cancels it.
        self.close_timer = self.loop.call_later(self.linger_seconds, self.transport.close)

    async def send(self, message: ASGISendEvent) -> None:
        if self.lingering:
            raise ClientDisconnected()  # the connection failed; the app sees it as gone, as before
        await super().send(message)
