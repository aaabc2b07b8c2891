"""A refused frame is answered with a close frame the client can read (server/web/ws_guard.py): a raw
socket sends a frame over ``ws_max_size`` in full and must read close 1009, not a TCP reset."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time

from server.web.app import create_app
from server.web.ws_guard import LingeringWebSocketProtocol
from tests.support import run_server, settings_for

OVERSIZED = 20 << 20  # the load bench's abuse frame; the server's limit is 16 MiB


def upgraded(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /ws HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"connection ended during the upgrade: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def text_frame_head(length: int) -> bytes:
    """A masked text frame's head with a zero mask, so the payload goes as it is."""
    return b"\x81\xff" + struct.pack("!Q", length) + b"\0\0\0\0"


def send_oversized(sock: socket.socket, length: int) -> str | None:
    """Send the whole frame; returns the error that cut the sending short, if any."""
    sock.sendall(text_frame_head(length))
    block = b"x" * (1 << 20)
    try:
        for _ in range(length // len(block)):
            sock.sendall(block)
    except OSError as exc:
        return repr(exc)
    return None


def read_to_end(sock: socket.socket) -> tuple[bytes, str | None]:
    """Everything the server sent until its end of stream, and the error if a reset came instead."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError as exc:
        return received, repr(exc)
    return received, None


def close_frame(received: bytes) -> tuple[int, str] | None:
    """The code and reason of the first close frame in the server's (unmasked) frames."""
    while len(received) >= 2:
        opcode, length, offset = received[0] & 0x0F, received[1] & 0x7F, 2
        if length == 126:
            length, offset = struct.unpack("!H", received[2:4])[0], 4
        elif length == 127:
            length, offset = struct.unpack("!Q", received[2:10])[0], 10
        payload = received[offset:offset + length]
        if opcode == 8:
            return struct.unpack("!H", payload[:2])[0], payload[2:].decode()
        received = received[offset + length:]
    return None


def test_ws_guard_oversized_frame_is_answered_with_close_1009_through_the_cli(tmp_path):
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n')
    with run_server(config) as running, upgraded(running.address) as sock:
        send_error = send_oversized(sock, OVERSIZED)
        received, read_error = read_to_end(sock)
    assert (send_error, read_error) == (None, None)  # no reset on either side
    close = close_frame(received)
    assert close is not None and close[0] == 1009, received[-200:]
    assert 0 < len(close[1]) <= 123 and "limit" in close[1]  # a short reason saying why


class QuickLinger(LingeringWebSocketProtocol):
    linger_seconds = 0.5


def test_ws_guard_a_peer_that_keeps_sending_is_cut_off_after_the_linger(tmp_path):
    with run_server(create_app(settings_for(tmp_path)), ws=QuickLinger, ws_max_size=1 << 20) as running, \
            upgraded(running.address) as sock:
        sock.sendall(text_frame_head(2 << 20))  # refused on its head; the payload never comes
        close = close_frame(sock.recv(65536))
        started = time.monotonic()
        assert close is not None and close[0] == 1009
        assert send_until_refused(sock, budget=10.0)
        held = time.monotonic() - started
    assert 0.4 < held < 5.0  # the server read and dropped input for its linger, then closed


def send_until_refused(sock: socket.socket, budget: float) -> bool:
    """Keep sending (the server drains it) until the server's close turns into an error here."""
    block, deadline = b"y" * 65536, time.monotonic() + budget
    try:
        while time.monotonic() < deadline:
            sock.sendall(block)
    except OSError:
        return True
    return False


class SmallInflight(LingeringWebSocketProtocol):
    max_inflight_bytes = 1 << 20


def fragment(payload: bytes, fin: bool, opcode: int = 1) -> bytes:
    """A masked frame (zero mask) that may leave its message unfinished (``fin`` False)."""
    length = len(payload)
    first = bytes([(0x80 if fin else 0) | opcode])
    if length < 126:
        return first + bytes([0x80 | length]) + b"\0\0\0\0" + payload
    return first + b"\xff" + struct.pack("!Q", length) + b"\0\0\0\0" + payload


def test_ws_guard_messages_arriving_at_once_are_bounded_the_largest_refused_with_1013(tmp_path):
    with run_server(create_app(settings_for(tmp_path)), ws=SmallInflight, ws_max_size=16 << 20) as running, \
            upgraded(running.address) as large, upgraded(running.address) as middle, \
            upgraded(running.address) as small:
        for sock, size in ((large, 600 << 10), (middle, 300 << 10), (small, 200 << 10)):
            # Messages that never end: the first fragment of each, 1,100 KiB together.
            sock.sendall(fragment(b'{"type": "nope", "x": "' + b"x" * size, fin=False))
        received, error = read_to_end(large)
        middle.sendall(fragment(b'"}', fin=True, opcode=0))  # the middle one's message still completes
        answer = b""
        while b"unknown_type" not in answer and (chunk := middle.recv(65536)):
            answer += chunk
    assert error is None and close_frame(received) == (1013, "too many large messages arriving at once; "
                                                              "try again later")
    assert b"unknown_type" in answer


def test_ws_guard_a_client_that_sends_pings_and_reads_nothing_is_cut_off(tmp_path):
    """websockets answers each ping whatever the socket's state: the answers must not pile up."""
    ping = b"\x89\xfd\0\0\0\0" + b"p" * 125  # a masked ping with the largest payload, 131 bytes
    block = ping * 8000  # about 1 MiB
    with run_server(create_app(settings_for(tmp_path)), ws=LingeringWebSocketProtocol) as running, \
            upgraded(running.address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and it reads nothing
        sent = 0
        try:
            while sent < 96:  # MiB: without the bound the server buffered the pongs (60 MB each)
                sock.sendall(block)
                sent += 1
        except OSError:
            pass
    assert sent < 64  # cut off after its 16 MiB of unread answers and what the kernels buffer
