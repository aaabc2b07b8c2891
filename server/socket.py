"""The ``/ws`` endpoint: one connection's state machine over protocol v1.

States: ``AWAITING_HELLO`` -> ``OPEN`` -> ``CLOSED``. The first frame must be ``hello``; anything
else gets an ``error`` frame naming what was expected and what came, and the connection stays.
After hello the connection is one outbox among the session's: a writer task drains it (joining
chunk frames that arrive within ``server.coalesce_ms``), a reader parses client frames and hands
them to the hub. Bad input gets an ``error`` frame; the connection and the session survive.

Sequence numbers: the ``session`` frame's ``seq`` is the baseline, every frame after it has a
higher one. On resume (``hello {session_id, last_seq}``) the baseline is ``last_seq`` and the frames
the client missed follow; when the log no longer reaches back, a fresh ``history`` snapshot comes
instead. Connection-local ``error`` frames carry the current ``seq`` without advancing it.
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.errors import BadFrame, MeterchatError, error_frame
from server.hub import SessionHub
from server.live import LiveSession, Outbox
from server.protocol import MAX_FRAME_BYTES, ClientFrame, parse_client_frame

log = logging.getLogger(__name__)


class ConnState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


def coalesce(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join runs of chunk frames of one turn into one frame carrying the last seq."""
    joined: list[dict[str, Any]] = []
    for frame in frames:
        last = joined[-1] if joined else None
        if (last is not None and frame["type"] == "chunk" and last["type"] == "chunk"
                and last["turn_id"] == frame["turn_id"]):
            joined[-1] = {**last, "content": last["content"] + frame["content"], "seq": frame["seq"]}
        else:
            joined.append(frame)
    return joined


class Connection:
    def __init__(self, websocket: WebSocket[Any], hub: SessionHub) -> None:
        self.ws = websocket
        self.hub = hub
        self.state = ConnState.AWAITING_HELLO
        self.live: LiveSession | None = None
        self.outbox = Outbox()
        self.coalesce_seconds = hub.rt.settings.server.coalesce_ms / 1000

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.write_loop)
                await self.read_loop()
                tasks.cancel_scope.cancel()
        finally:
            self.state = ConnState.CLOSED
            self.detach()

    def detach(self) -> None:
        live = self.live
        if live is None:
            return
        live.outboxes.discard(self.outbox)
        keep = self.hub.rt.settings.server.keep_generating
        if not live.outboxes and not keep and live.turn is not None:
            live.turn.cancel_scope.cancel()

    def send_local(self, frame: dict[str, Any]) -> None:
        self.outbox.push({**frame, "seq": self.live.seq if self.live else 0})

    async def read_loop(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                self.send_local(error_frame(BadFrame("binary frames are not part of protocol v1")))
                continue
            if len(raw) > MAX_FRAME_BYTES:
                self.send_local(error_frame(BadFrame(f"frame larger than {MAX_FRAME_BYTES} bytes")))
                continue
            await self.handle_text(raw)

    async def handle_text(self, raw: str) -> None:
        frame: ClientFrame | None = None
        try:
            frame = parse_client_frame(raw)
            await self.dispatch(frame)
        except MeterchatError as exc:
            body = error_frame(exc)
            if frame is not None and frame.type == "message":
                body["message_id"] = frame.get("id")
            self.send_local(body)

    async def dispatch(self, frame: ClientFrame) -> None:
        if self.state is ConnState.AWAITING_HELLO:
            if frame.type != "hello":
                raise BadFrame(f"expected a hello frame first, got {frame.type!r}")
            await self.hello(frame)
            return
        live = self.live
        assert live is not None
        if frame.type == "hello":
            raise BadFrame("this connection already said hello; open a new connection for another session")
        if frame.type == "message":
            await self.hub.submit(live, frame.get("id"), frame.get("content"), frame.get("images"),
                                  frame.get("retry_of"))
        elif frame.type == "switch_model":
            await self.hub.switch(live, frame.get("route"))
        elif frame.type == "stop":
            self.hub.stop(live)

    async def hello(self, frame: ClientFrame) -> None:
        requested = frame.get("session_id")
        live = await self.hub.open(requested)
        resumed = requested == live.id
        last_seq = frame.get("last_seq")
        replay = live.replay_after(last_seq) if resumed and last_seq is not None else None
        if replay is not None:
            initial = [self.hub.snapshot(live, True, last_seq), *replay]
        else:
            initial = [self.hub.snapshot(live, resumed, live.seq), self.hub.history(live)]
        # No await between the snapshot and joining the session: no frame can fall in between.
        for item in initial:
            self.outbox.push(item)
        live.outboxes.add(self.outbox)
        self.live = live
        self.state = ConnState.OPEN
        if replay is None:
            # In the background: a window discovery on a slow provider must not hold the reader.
            self.hub.spawn(self.hub.after_hello, live)

    async def write_loop(self) -> None:
        while True:
            await self.outbox.wait()
            if self.outbox.overflowed:
                await self.ws.close(code=1013, reason="client too slow; reconnect with last_seq")
                return
            if self.coalesce_seconds and self.outbox.frames[0]["type"] == "chunk":
                await anyio.sleep(self.coalesce_seconds)
            frames = list(self.outbox.frames)
            self.outbox.frames.clear()
            for frame in coalesce(frames) if self.coalesce_seconds else frames:
                try:
                    await self.ws.send_text(json.dumps(frame, ensure_ascii=False))
                except (WebSocketDisconnect, RuntimeError):
                    return
