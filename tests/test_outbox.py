"""A client that stops reading is cut off once it is ``server.max_outbox_bytes`` behind (close
1008), the other tabs of its session never notice, and it resumes exactly by seq."""

from __future__ import annotations

import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from server.errors import ConfigError
from tests.support import Client, client, serve, settings_for, text_of

pytestmark = pytest.mark.anyio

LIMIT = 32 * 1024
PIECES = 6000  # "a " pieces: about 450 KB of chunk frames per reply
# Two replies (900 KB) are past what the socket buffers can take in even when Linux grows the
# server's send buffer to its maximum, so the rest must back up into the outbox.
REPLIES = 2


def small_window_socket(address: str) -> socket.socket:
    """A client socket whose receive buffer is tiny, so the server's writes back up quickly."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # A small segment size keeps the server's send buffer small too (Linux sizes it from the
    # segment size), so a few hundred KB unread back up into the server's outbox.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 128)
    host, port = address.split(":")
    sock.connect((host, int(port)))
    return sock


async def test_a_client_that_stops_reading_is_closed_with_1008_and_resumes_by_seq(tmp_path):
    text = "a " * PIECES
    with serve(settings_for(tmp_path, max_outbox_bytes=LIMIT)) as address:
        # max_queue=1: the client stops reading its socket once one frame waits unread; no
        # compression, so the bytes on the wire are the frames' own (the outbox counts those).
        async with connect(f"ws://{address}/ws", sock=small_window_socket(address), max_queue=1,
                           max_size=None, compression=None) as ws, client(address) as tab:
            slow = Client(ws)
            await slow.hello()
            await tab.hello(slow.session_id)
            await slow.send("message", id="q0", content="echo " + text)
            frames = await tab.until("done", timeout=30)  # the reading tab gets every frame
            for n in range(1, REPLIES):
                await tab.send("message", id=f"q{n}", content="echo " + text)
                frames += await tab.until("done", timeout=30)
            assert text_of(frames).split() == text.split() * REPLIES
            with pytest.raises(ConnectionClosed):
                while True:
                    await slow.recv()
            assert ws.close_code == 1008 and "last_seq" in (ws.close_reason or "")
        assert sum(f["type"] == "done" for f in slow.frames) < REPLIES  # cut off before the end
        last_seq = slow.frames[-1]["seq"]
        async with client(address) as again:
            head = await again.hello(slow.session_id, last_seq)
            assert head[-1]["type"] == "session" and head[-1]["seq"] == last_seq
            rest = await again.until("done", timeout=30)
            while sum(f["type"] == "done" for f in slow.frames + rest) < REPLIES:
                rest += await again.until("done", timeout=30)
        assert text_of(slow.frames) + text_of(rest) == text_of(frames)  # nothing lost or repeated


def test_an_outbox_bound_of_zero_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"server\.max_outbox_bytes: must be greater than 0"):
        settings_for(tmp_path, max_outbox_bytes=0)
