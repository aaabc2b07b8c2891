"""``Connection``: one ``/ws`` connection's state machine over protocol v1.

States: ``AWAITING_HELLO`` -> ``OPEN`` -> ``CLOSED``. The first frame must be ``hello``; anything
else gets an ``error`` frame naming what was expected and what came, and the connection stays.
After hello the connection is one outbox among the session's: a writer task drains it (joining
chunk frames that arrive within ``server.coalesce_ms``), a reader parses client frames and hands
them to the hub. Whatever goes wrong while a client frame is parsed or handled becomes an ``error``
frame for this client (``message_id`` on a ``message``); the connection and the session go on. The
connection only carries frames: what a joining client receives first is decided by the session's
``FrameChannel`` (through ``SessionHub.attach``).

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

from server.channel import Frame, Outbox
from server.errors import BadFrame, MeterchatError, error_frame
from server.hub import SessionHub
from server.protocol import MAX_FRAME_BYTES, ClientFrame, parse_client_frame
from server.session import Session

log = logging.getLogger(__name__)


class ConnState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


def coalesce(frames: list[Frame]) -> list[Frame]:
    """Join runs of chunk frames of one turn into one frame carrying the last seq."""
    joined: list[Frame] = []
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
        self.session: Session | None = None
        self.outbox = Outbox()
        self.coalesce_seconds = hub.coalesce_seconds

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.write_loop)
                await self.read_loop()
                tasks.cancel_scope.cancel()
        finally:
            self.state = ConnState.CLOSED
            if self.session is not None:
                self.hub.detach(self.session, self.outbox)

    def send_local(self, frame: Frame) -> None:
        self.outbox.push({**frame, "seq": self.session.seq if self.session else 0})

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
        except Exception as exc:  # one bad frame must never cost the client its connection
            if not isinstance(exc, MeterchatError):
                log.exception("handling a %s frame failed", frame.type if frame else "client")
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
        session = self.session
        assert session is not None
        if frame.type == "hello":
            raise BadFrame("this connection already said hello; open a new connection for another session")
        if frame.type == "message":
            await self.hub.submit(session, frame.get("id"), frame.get("content"), frame.get("images"),
                                  frame.get("retry_of"))
        elif frame.type == "switch_model":
            await self.hub.switch(session, frame.get("route"))
        elif frame.type == "stop":
            self.hub.stop(session)

    async def hello(self, frame: ClientFrame) -> None:
        try:
            self.session = await self.hub.attach(self.outbox, frame.get("session_id"), frame.get("last_seq"))
        except MeterchatError as exc:
            if not exc.retryable:
                raise
            # A shared part (the live stream) is away: say so and close, so the client reconnects
            # with its backoff instead of waiting on a socket that will never open the session.
            self.send_local(error_frame(exc))
            self.outbox.end("try again later; reconnect with last_seq")
            return
        self.state = ConnState.OPEN

    async def write_loop(self) -> None:
        while True:
            await self.outbox.wait()
            if self.outbox.overflowed:
                if self.outbox.ending:  # e.g. the live stream went away: say why, then close
                    await self.send_frames(list(self.outbox.frames))
                await self.ws.close(code=1013, reason=self.outbox.close_reason)
                return
            if self.coalesce_seconds and self.outbox.frames[0]["type"] == "chunk":
                await anyio.sleep(self.coalesce_seconds)
            frames = list(self.outbox.frames)
            self.outbox.frames.clear()
            if not await self.send_frames(coalesce(frames) if self.coalesce_seconds else frames):
                return

    async def send_frames(self, frames: list[Frame]) -> bool:
        """False when the socket is gone."""
        for frame in frames:
            try:
                await self.ws.send_text(json.dumps(frame, ensure_ascii=False))
            except (WebSocketDisconnect, RuntimeError):
                return False
        return True
