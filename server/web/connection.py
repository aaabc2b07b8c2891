"""``Connection``: one ``/ws`` connection's state machine over protocol v1.

States: ``AWAITING_HELLO`` -> ``OPEN`` -> ``CLOSED``. The first frame must be ``hello``; anything
else gets an ``error`` frame naming what was expected and what came, and the connection stays.
After hello the connection is one outbox among the session's: a writer task drains it (joining
chunk frames that arrive within ``server.coalesce_ms``; with no such wait, a frame pushed while the
writer waits on an empty queue goes to the socket at once, from the task that made it, if the socket
takes it without waiting), a reader parses client frames and hands them to the hub. Whatever goes
wrong while a client frame is parsed or handled becomes an ``error`` frame for this client
(``message_id`` on a ``message``); the connection and the session go on. The connection only
carries frames: what a joining client receives first is decided by the session's
``FrameChannel`` (through ``SessionHub.attach``).

Sequence numbers: the ``session`` frame's ``seq`` is the baseline, every frame after it has a
higher one. On resume (``hello {session_id, last_seq}``) the baseline is ``last_seq`` and the frames
the client missed follow; when the log no longer reaches back, a fresh ``history`` snapshot comes
instead. Connection-local ``error`` frames carry the current ``seq`` without advancing it.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.errors import BadFrame, FrameFlood, MeterchatError, error_frame
from server.live.lease import LiveUnavailable
from server.protocol import MAX_FRAME_BYTES, ClientFrame, parse_client_frame
from server.sessions.channel import Frame, Outbox, Packet
from server.sessions.hub import SessionHub
from server.sessions.session import Session
from server.web.limits import TokenBucket
from server.web.ws_guard import SEND_TEXTS, WRITE_TEXT_NOW

log = logging.getLogger(__name__)

CLOSE_SECONDS = 10.0  # how long a 1008 close may wait for a socket the client stopped reading


class ConnState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


def coalesce(packets: list[Packet]) -> list[Packet]:
    """Join runs of chunk packets of one turn into one frame carrying the last seq (a run of one
    leaves as it came: its text is the one the channel serialized)."""
    if len(packets) == 1:  # a server that keeps up: one packet per wake-up
        return packets
    joined: list[Packet] = []
    run: list[Packet] = []
    for packet in packets:
        if run and not same_turn_chunk(run[-1], packet):
            joined.append(join_run(run))
            run = []
        if packet.frame is not None:
            run.append(packet)
        else:
            joined.append(packet)
    if run:
        joined.append(join_run(run))
    return joined


def same_turn_chunk(last: Packet, packet: Packet) -> bool:
    return (packet.frame is not None and last.frame is not None
            and packet.frame["turn_id"] == last.frame["turn_id"])


def join_run(run: list[Packet]) -> Packet:
    if len(run) == 1:
        return run[0]
    last = run[-1].frame
    assert last is not None
    content = "".join(p.frame["content"] for p in run if p.frame is not None)
    joined = Packet.of({**last, "content": content})
    joined.size = sum(p.size for p in run)  # what the outbox counted for the run
    return joined


class Connection:
    def __init__(self, websocket: WebSocket[Any], hub: SessionHub, owner: str | None = None,
                 user_bucket: TokenBucket | None = None) -> None:
        self.ws = websocket
        self.hub = hub
        self.owner = owner  # the signed-in user's id: the only sessions this socket may open
        self.state = ConnState.AWAITING_HELLO
        self.session: Session | None = None
        self.outbox = Outbox(hub.rt.settings.server.max_outbox_bytes)
        self.coalesce_seconds = hub.coalesce_seconds
        self.limits = hub.rt.settings.server
        self.bucket = TokenBucket(self.limits.frame_rate, self.limits.frame_burst)
        self.user_bucket = user_bucket  # the signed-in user's, shared with their other sockets
        self.flooding = False  # one rate_limited answer per run of refused frames, not one each

    async def run(self) -> None:
        if not self.hub.admit():
            await self.ws.close(code=1013, reason="server at max_connections; try again later")
            return
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.write_loop)
                await self.read_loop()
                tasks.cancel_scope.cancel()
        finally:
            self.hub.release()
            self.state = ConnState.CLOSED
            if self.session is not None:
                self.hub.detach(self.session, self.outbox)

    def send_local(self, frame: Frame) -> None:
        self.outbox.push(Packet.of({**frame, "seq": self.session.seq if self.session else 0}))

    async def read_loop(self) -> None:
        while True:
            message = await self.receive()
            if message is None or message["type"] == "websocket.disconnect":
                return
            if not self.within_rate():
                continue
            raw = message.get("text")
            if raw is None:
                self.send_local(error_frame(BadFrame("binary frames are not part of protocol v1")))
                continue
            if len(raw) > MAX_FRAME_BYTES:
                self.send_local(error_frame(BadFrame(f"frame larger than {MAX_FRAME_BYTES} bytes")))
                continue
            await self.handle_text(raw)

    async def receive(self) -> dict[str, Any] | None:
        """The next message from the client, or None once the connection was closed for idling: no
        hello in time, or no frame for ``idle_timeout_seconds`` while no reply streams."""
        while True:
            waited = self.read_timeout()
            with anyio.move_on_after(waited):
                return dict(await self.ws.receive())
            if self.state is ConnState.AWAITING_HELLO:
                await self.close(1008, f"no hello within {waited:g} s")
                return None
            if self.session is None or not self.session.busy:
                await self.close(1001, f"idle for {waited:g} s; reconnect with last_seq")
                return None

    def read_timeout(self) -> float:
        if self.state is ConnState.AWAITING_HELLO:
            return self.limits.hello_timeout_seconds
        return self.limits.idle_timeout_seconds or float("inf")

    def within_rate(self) -> bool:
        """Spend a token for this frame; a refused frame is dropped unread, and the first of a run
        is answered with ``rate_limited``."""
        rate, burst, whose = self.limits.frame_rate, self.limits.frame_burst, ""
        wait = self.bucket.take()
        if not wait and self.user_bucket is not None:
            wait = self.user_bucket.take()
            auth = self.hub.rt.settings.auth
            rate, burst, whose = auth.user_frame_rate, auth.user_frame_burst, " over all your connections"
        if not wait:
            self.flooding = False
            return True
        if not self.flooding:
            self.flooding = True
            self.send_local(error_frame(FrameFlood(
                f"more than {rate:g} frames a second{whose} (burst {burst}); "
                "frames are dropped until the rate falls", retry_after=round(wait, 3))))
        return False

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
                                  frame.get("retry_of"), frame.get("edit_of"))
        elif frame.type == "switch_model":
            await self.hub.switch(session, frame.get("route"))
        elif frame.type == "stop":
            self.hub.stop(session)
        elif frame.type == "history_before":
            self.send_local(self.hub.history_before(session, frame.get("before_id"), frame.get("limit")))
        elif frame.type == "tool_decision":
            self.hub.decide(session, frame.get("turn_id"), frame.get("id"), frame.get("allow"))
        elif frame.type == "preview_edit":  # an answer for this client alone, like its errors
            self.send_local(await self.hub.preview_edit(session, frame.get("turn_id")))

    async def hello(self, frame: ClientFrame) -> None:
        try:
            self.session = await self.hub.attach(self.outbox, frame.get("session_id"), frame.get("last_seq"),
                                                 self.owner)
        except LiveUnavailable as exc:
            # The live stream is away: say so and close, so the client reconnects with its backoff
            # instead of waiting on a socket that will never open the session. A store outage is
            # answered like any other error: the connection stays and the client may say hello again.
            self.send_local(error_frame(exc))
            self.outbox.end("try again later; reconnect with last_seq")
            return
        self.state = ConnState.OPEN

    async def write_loop(self) -> None:
        """Send what the outbox holds; a client that falls ``max_outbox_bytes`` behind is closed
        with 1008 even while a send waits on its full socket, an ended outbox with 1013 once what
        it holds is sent."""
        with anyio.CancelScope() as writing:
            self.outbox.on_overflow = writing.cancel
            if not self.outbox.overflowed:
                await self.send_loop()
        self.outbox.on_overflow = None
        if self.outbox.overflowed:
            await self.close(1008, "client too slow; reconnect with last_seq")
        elif self.outbox.ending is not None:
            await self.close(1013, self.outbox.ending)

    async def close(self, code: int, reason: str) -> None:
        with anyio.move_on_after(CLOSE_SECONDS):  # a peer that never reads never takes the close
            try:
                await self.ws.close(code=code, reason=reason)
            except (WebSocketDisconnect, RuntimeError):
                pass

    async def send_loop(self) -> None:
        """Send until the socket is gone or the outbox was ended and is empty."""
        outbox = self.outbox
        # Where meterchat's own WebSocket protocol serves (ws_guard.py), a batch goes to the
        # transport as one write, past Starlette's and uvicorn's per-frame send.
        extensions = self.ws.scope.get("extensions", {})
        direct = extensions.get(SEND_TEXTS)
        if not self.coalesce_seconds:  # no wait to join chunks: a frame may leave from its maker
            outbox.direct = extensions.get(WRITE_TEXT_NOW)
        try:
            while True:
                if not outbox.frames:  # a writer that fell behind finds frames and does not wait
                    await outbox.wait()
                    if not outbox.frames:  # ended, and everything before the end is sent
                        return
                if self.coalesce_seconds and outbox.frames[0].frame is not None:
                    await anyio.sleep(self.coalesce_seconds)
                # Adaptive: chunks that piled up while the loop was busy leave as one frame.
                packets = coalesce(outbox.take())
                if direct is not None:
                    if not await direct([packet.text for packet in packets]):
                        return
                    outbox.sent(sum(packet.size for packet in packets))
                    continue
                for packet in packets:
                    try:
                        await self.ws.send_text(packet.text)
                    except (WebSocketDisconnect, RuntimeError):
                        return
                    outbox.sent(packet.size)
        finally:
            outbox.direct = None  # the socket is done with: frames queue (and are dropped with it)
