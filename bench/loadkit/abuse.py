"""The abuse mix run beside the well-behaved sessions (``--abuse``): a client that asks for a long
reply and never reads, one that floods bad frames, and one that sends a frame over the server's
size limit. Their outcome is reported; the point is what the others' delays and the server's RSS do
meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any, cast

from bench.loadkit.wire import ask, ws_frame, ws_frames, ws_json, ws_upgrade

BAD_FRAMES = [b'{"type": "nope"}', b"[]", b"not json", b'{"type": "message"}', b'{"type": "hello"}']


class Abuser(asyncio.Protocol):
    """Upgrades, says hello, then misbehaves in the way ``kind`` names; counts what comes back."""

    def __init__(self, kind: str, host: str, tokens: int, outcome: dict[str, Any]) -> None:
        self.kind, self.host, self.tokens, self.outcome = kind, host, tokens, outcome
        self.buffer, self.upgraded = bytearray(), False
        self.transport: asyncio.Transport | None = None
        outcome.update(sent=0, answered=0, closed=None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(ws_upgrade(self.host))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buffer[:end + 4]
            self.upgraded = True
            self.send(ws_json({"type": "hello"}))
        for opcode, payload in ws_frames(self.buffer):
            if opcode == 8:
                self.outcome["closed"] = int.from_bytes(payload[:2], "big") if payload else 1005
            elif opcode == 1:
                self.on_frame(json.loads(payload))

    def on_frame(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "session":
            self.misbehave()
        elif frame.get("type") == "error":
            self.outcome["answered"] += 1

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
        while self.transport is not None and not self.transport.is_closing():
            self.send(b"".join(ws_frame(frame) for frame in BAD_FRAMES * 20))
            await asyncio.sleep(0.01)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.outcome["sent"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.outcome["closed"] is None:
            self.outcome["closed"] = "dropped without a close frame"


async def start(host: str, tokens: int) -> dict[str, dict[str, Any]]:
    """Open the three abusers; their outcome dicts fill in while the run goes on."""
    loop = asyncio.get_running_loop()
    address, port = host.rsplit(":", 1)
    outcomes: dict[str, dict[str, Any]] = {}
    for kind in ("non_reader", "flood", "oversized"):
        outcome = outcomes.setdefault(kind, {})
        try:
            await loop.create_connection(abuser_factory(kind, host, tokens, outcome), address, int(port))
        except OSError as exc:
            outcome["closed"] = f"connect failed: {exc}"
    return outcomes


def abuser_factory(kind: str, host: str, tokens: int, outcome: dict[str, Any]) -> Callable[[], Abuser]:
    return lambda: Abuser(kind, host, tokens, outcome)
