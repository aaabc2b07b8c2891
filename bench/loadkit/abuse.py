"""The abuse mix run beside the well-behaved sessions (``--abuse``): a client that asks for a long
reply and never reads, one that floods bad frames, and one that sends a frame over the server's
size limit. Their outcome is reported; the point is what the others' delays and the server's RSS do
meanwhile.

The flood and the oversized client answer the server's keepalive pings as every WebSocket client
does (a browser's network stack answers them whatever the page does): a client that never answers
is closed by uvicorn with 1011 "keepalive ping timeout" after ``ws_ping_interval`` +
``ws_ping_timeout`` (40 s), which ends the flood for a reason that is not the flood. The flood also
writes only while its own send buffer is small, so it sends as fast as the server reads and its
pongs are not queued behind megabytes of its own frames. The non-reader cannot answer pings (it
reads nothing); what ended it (outbox bound 1008, keepalive 1011, or nothing yet) is read when the
run ends (``AbuseMix.finish``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from bench.loadkit.wire import ask, ws_frame, ws_frames, ws_json, ws_upgrade

BAD_FRAMES = [b'{"type": "nope"}', b"[]", b"not json", b'{"type": "message"}', b'{"type": "hello"}']
BURST = BAD_FRAMES * 20  # 100 frames every FLOOD_PAUSE: up to 10,000 frames/s
FLOOD_PAUSE = 0.01
FLOOD_BUFFER = 64 << 10  # the flood skips a burst while this much of its own output is unsent
OPEN = "open at the end"


class Abuser(asyncio.Protocol):
    """Upgrades, says hello, then misbehaves in the way ``kind`` names; counts what comes back."""

    def __init__(self, kind: str, host: str, tokens: int, mix: AbuseMix) -> None:
        self.kind, self.host, self.tokens, self.mix = kind, host, tokens, mix
        self.outcome = mix.outcomes[kind]
        self.answers: Counter[str] = Counter()
        self.buffer, self.upgraded, self.stopped = bytearray(), False, False
        self.transport: asyncio.Transport | None = None
        self.outcome.update(sent=0, answers=self.answers, pongs=0, bytes_in=0, closed=None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(ws_upgrade(self.host))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.outcome["bytes_in"] += len(data)
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buffer[:end + 4]
            self.upgraded = True
            self.send(ws_json({"type": "hello"}))
        for opcode, payload in ws_frames(self.buffer):
            self.on_frame(opcode, payload)
        self.mix.changed.set()

    def on_frame(self, opcode: int, payload: bytes) -> None:
        if opcode == 9:
            self.send(ws_frame(payload, 10), count=0)
            self.outcome["pongs"] += 1
        elif opcode == 8:
            self.outcome["closed"] = close_reason(payload)
        elif opcode == 1:
            frame = json.loads(payload)
            if frame.get("type") == "session" and self.outcome["sent"] == 1:  # after the hello
                self.misbehave()
            elif frame.get("type") == "error":
                self.answers[str(frame.get("code"))] += 1

    def misbehave(self) -> None:
        if self.kind == "non_reader":
            self.send(ws_json({"type": "message", "id": os.urandom(8).hex(),
                               "content": ask(self.tokens, 0)}))
            assert self.transport is not None
            self.transport.pause_reading()  # never reads again: the server's outbox must bound it
        elif self.kind == "oversized":
            self.send(ws_frame(b'{"type": "message", "content": "' + b"x" * (20 << 20) + b'"}'))
        else:
            asyncio.ensure_future(self.flood())

    async def flood(self) -> None:
        burst = b"".join(ws_frame(frame) for frame in BURST)
        while not self.stopped and self.transport is not None and not self.transport.is_closing():
            if self.transport.get_write_buffer_size() < FLOOD_BUFFER:
                self.send(burst, count=len(BURST))
            await asyncio.sleep(FLOOD_PAUSE)

    def send(self, data: bytes, count: int = 1) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.outcome["sent"] += count

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.outcome["closed"] is None:
            self.outcome["closed"] = "dropped without a close frame"
        self.mix.changed.set()


def close_reason(payload: bytes) -> str:
    """A close frame's code and reason, e.g. ``1011 keepalive ping timeout``."""
    if len(payload) < 2:
        return "1005"
    reason = payload[2:].decode(errors="replace")
    return f"{int.from_bytes(payload[:2], 'big')} {reason}".strip()


class AbuseMix:
    """The three abusers of one run and their outcomes (plain data, printed by the report)."""

    KINDS = ("non_reader", "flood", "oversized")

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, Any]] = {kind: {} for kind in self.KINDS}
        self.abusers: list[Abuser] = []
        self.changed = asyncio.Event()

    def factory(self, kind: str, host: str, tokens: int) -> Callable[[], Abuser]:
        def make() -> Abuser:
            self.abusers.append(Abuser(kind, host, tokens, self))
            return self.abusers[-1]
        return make

    async def until(self, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float) -> bool:
        """Wait for the outcomes to satisfy ``done`` (woken by each frame the abusers read)."""
        try:
            async with asyncio.timeout(timeout):
                while not done(self.outcomes):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            return False
        return True

    async def finish(self, linger: float = 3.0) -> dict[str, dict[str, Any]]:
        """Stop the flood, let the non-reader read what waited for it (a close frame the server
        sent it comes after the frames before it), and say which connections were still open."""
        for abuser in self.abusers:
            abuser.stopped = True
            if abuser.transport is not None and abuser.kind == "non_reader":
                abuser.transport.resume_reading()
        await self.until(lambda outcomes: bool(outcomes["non_reader"].get("closed")), linger)
        for abuser in self.abusers:
            if abuser.transport is not None:
                abuser.outcome["closed"] = abuser.outcome["closed"] or OPEN
                abuser.transport.close()
        return self.outcomes


async def start(host: str, tokens: int) -> AbuseMix:
    """Open the three abusers; their outcome dicts fill in while the run goes on."""
    loop = asyncio.get_running_loop()
    address, port = host.rsplit(":", 1)
    mix = AbuseMix()
    for kind in AbuseMix.KINDS:
        try:
            await loop.create_connection(mix.factory(kind, host, tokens), address, int(port))
        except OSError as exc:
            mix.outcomes[kind]["closed"] = f"connect failed: {exc}"
    return mix
