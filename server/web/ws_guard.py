"""The WebSocket protocol ``meterchat`` serves with: uvicorn's sans-I/O websockets protocol with a
lingering close after a frame it refuses, a bound on the messages still arriving over all sockets,
and one on what waits to be sent to each.

A frame over ``ws_max_size`` (or one that breaks the protocol) makes websockets fail the connection
with a close frame (1009 "over size limit", 1002, 1007). uvicorn then writes that frame and closes
the socket at once, while the rest of the refused frame (megabytes) is still unread in the kernel:
closing a socket with unread data sends a TCP reset, and a reset makes the client's kernel drop
what it had not yet read, the close frame included. The client saw a dropped connection where the
protocol promises an answer.

``LingeringWebSocketProtocol`` closes the way HTTP servers do (a "lingering close"): it writes the
close frame, half-closes its side (FIN, so the client reads the frame and then the end), stops
feeding the parser and drops whatever still arrives, and closes when the peer closes or after
``linger_seconds``, whichever comes first. A peer that keeps sending costs a read and a discard
per chunk, never memory, and no longer than the linger.

It also bounds the bytes of messages still arriving, over all sockets of the process: websockets
buffers a message until its last byte (up to ``ws_max_size``, 16 MiB), and a client that sends all
but the last byte of a message, on each of ``max_connections`` sockets, answering pings, held
16 MiB x 2,000 = 32 GiB for an hour (``idle_timeout_seconds``). Past ``max_inflight_bytes`` the
socket holding the most is failed with 1013 "try again later" (a lingering close as above).

And it bounds what waits to be sent to a client that does not read: the app writes only while the
socket takes it, but websockets answers every ping with a pong whatever the socket's state, so a
client sending pings and reading nothing grew the server's send buffer by what it sent (60 MB
per socket before the buffer stopped growing). Past ``max_unsent_bytes`` the socket is aborted:
a client that reads nothing would not read a close frame either.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

LINGER_SECONDS = 3.0  # long enough for a 20 MiB frame over a slow LAN link, short for a held socket
# Four full-size messages (images) arriving at once; the frames of chat are a few hundred bytes.
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
# Above the app's own overshoot (it writes one frame past the transport's high-water mark: at most a
# history page, 1 MiB of text, a few MiB once JSON escapes it) and well below what a pong flood
# piled up.
MAX_UNSENT_BYTES = 16 * 1024 * 1024
# The scope extension under which the protocol offers ``send_texts`` to the app (web/connection.py),
# and how much one direct write carries: one frame per coalesced batch of chunks, and below the
# transport's buffer bounds above however many frames the outbox holds.
SEND_TEXTS = "meterchat.send_texts"
DIRECT_WRITE_BYTES = 64 * 1024
# The scope extension under which it offers ``write_text_now``: one frame written at once, from
# the task that made it, when the socket takes it without waiting (web/connection.py hands it to
# the outbox, which writes past its writer task while that task waits on an empty queue).
WRITE_TEXT_NOW = "meterchat.write_text_now"


class LingeringWebSocketProtocol(WebSocketsSansIOProtocol):
    linger_seconds = LINGER_SECONDS
    lingering = False  # a close frame was sent on a failed connection; input is dropped
    max_inflight_bytes = MAX_INFLIGHT_BYTES
    max_unsent_bytes = MAX_UNSENT_BYTES
    arriving = 0  # bytes read since this socket's last complete message (what websockets buffers)
    holders: ClassVar[set[LingeringWebSocketProtocol]] = set()  # sockets with a message arriving

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the rest of a refused frame, or anything after it: read so it cannot reset
        self._arrive(len(data))
        super().data_received(data)
        if self.transport.get_write_buffer_size() > self.max_unsent_bytes:
            self.transport.abort()  # answers to its pings that it never reads
            return
        if not self.lingering and self.inflight() > self.max_inflight_bytes:
            largest = max(self.holders, key=lambda holder: holder.arriving)
            largest.refuse(1013, "too many large messages arriving at once; try again later")

    def send_receive_event_to_app(self) -> None:
        self._arrive(-self.arriving)  # the message is complete: the app holds it now, not the parser
        super().send_receive_event_to_app()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arrive(-self.arriving)
        super().connection_lost(exc)

    def _arrive(self, count: int) -> None:
        self.arriving += count
        if self.arriving:
            self.holders.add(self)
        else:
            self.holders.discard(self)

    def inflight(self) -> int:
        return sum(holder.arriving for holder in self.holders)

    def refuse(self, code: int, reason: str) -> None:
        """Fail the connection with ``code`` and close it the lingering way."""
        if self.conn.state is not State.OPEN:  # still in its handshake: nothing to close politely
            self._arrive(-self.arriving)
            self.transport.close()
            return
        self.conn.fail(code, reason)
        self.handle_parser_exception()

    def handle_parser_exception(self) -> None:
        self._arrive(-self.arriving)  # what still arrives is dropped, not buffered
        self.frames = []  # fragments of a message that will never end (fail() emptied the parser's)
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
        self.close_timer = self.loop.call_later(self.linger_seconds, self.linger_over)

    def linger_over(self) -> None:
        # A peer that read nothing in the linger would hold the close frame's bytes (and this
        # socket) for as long as it keeps its window shut: drop them.
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    async def send(self, message: ASGISendEvent) -> None:
        if self.lingering:
            raise ClientDisconnected()  # the connection failed; the app sees it as gone, as before
        await super().send(message)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # none when the handshake was refused
        if scope is not None:
            scope["extensions"][SEND_TEXTS] = self.send_texts
            scope["extensions"][WRITE_TEXT_NOW] = self.write_text_now

    async def send_texts(self, texts: list[str]) -> bool:
        """Send ``texts`` as text frames, written to the transport together in writes of about
        ``DIRECT_WRITE_BYTES``, each after the socket took the previous (uvicorn's ``writable``);
        False once the connection is gone or closing (nothing more can be sent)."""
        batch: list[bytes] = []
        size = 0
        for text in texts:
            data = text.encode()
            batch.append(data)
            size += len(data)
            if size >= DIRECT_WRITE_BYTES:
                if not await self._write_frames(batch):
                    return False
                batch, size = [], 0
        return not batch or await self._write_frames(batch)

    def write_text_now(self, text: str) -> bool:
        """Write ``text`` as one text frame now if the socket takes it without waiting (the
        transport is below its high water: uvicorn's ``writable`` is set); False, nothing written,
        when it would have to wait or the connection is gone or closing: the caller queues it."""
        conn = self.conn  # in place, so no extension or debug framing either (never with meterchat's)
        if not self.writable.is_set() or conn.writes or not self._open() or conn.extensions or conn.debug:
            return False  # (what websockets queued, a pong, leaves first: by the batch path)
        data = text.encode()
        size = len(data)  # a chunk frame is short: its head is two bytes, made here (a call less)
        self.transport.write((bytes((0x81, size)) if size < 126 else text_frame_head(size)) + data)
        return True

    async def _write_frames(self, batch: list[bytes]) -> bool:
        await self.writable.wait()
        return self._write_now(batch)

    def _open(self) -> bool:
        """The connection takes a data frame: no close under way, no fragmented message open."""
        conn = self.conn
        return not (self.disconnected or self.close_sent or self.lingering or self.transport.is_closing()
                    or conn.state is not State.OPEN or conn.expect_continuation_frame)

    def _write_now(self, batch: list[bytes]) -> bool:
        conn = self.conn
        if not self._open():
            return False
        writes = conn.data_to_send()  # anything websockets queued (a pong) leaves first
        if conn.extensions or conn.debug:  # never with meterchat's options; websockets frames them
            for data in batch:
                conn.send_text(data)
            writes += conn.data_to_send()
        else:
            for data in batch:
                writes += (text_frame_head(len(data)), data)
        self.transport.write(b"".join(writes))  # one write for the batch
        return True


def text_frame_head(size: int) -> bytes:
    """The head of a final, unmasked text frame of ``size`` payload bytes (RFC 6455 5.2): the bytes
    websockets' ``Frame.serialize`` puts before the payload for a server without extensions, made
    without its Frame object and per-frame checks (the hottest write of a reply)."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65536:
        return _HEAD_16.pack(0x81, 126, size)
    return _HEAD_64.pack(0x81, 127, size)


_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")
