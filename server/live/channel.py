"""A session's frame channel spread over several instances: ``RedisChannel``, on Redis streams.

Same ``emit``/``join``/``detach`` as ``channel.FrameChannel``, so the session does not know which it
has. ``emit`` hands the frame to the instance's appender (live_append.py), which gives it its seq in
Redis; a local client gets a frame the moment its seq is known when nothing can be missing before
it, otherwise from the session's live channel or its stream (``arrived``, in seq order, fed by
live_redis.py). A client joins by reading the stream after its ``last_seq``, or gets a snapshot.
When Redis fails under the channel, its clients get a ``live_unavailable`` error and their sockets
close, so they reconnect and resume instead of waiting on a stream that says nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

import anyio

from server.errors import error_frame
from server.live.lease import LiveUnavailable
from server.sessions.channel import Frame, FrameChannel, Outbox, Packet
from server.sessions.events import EventBus


class LiveSide(Protocol):
    """What a channel asks of its instance's connection to Redis (``live_redis.RedisLive``): a
    protocol, so the connection can make channels without the two modules importing each other."""

    bus: EventBus
    instance: str

    def enqueue(self, channel: RedisChannel, frame: Frame) -> None: ...

    def watch(self, channel: RedisChannel) -> None: ...

    def unwatch(self, channel: RedisChannel) -> None: ...

    async def read_after(self, session_id: str, last_seq: int) -> tuple[list[Frame], int] | None: ...

    async def head_seq(self, session_id: str) -> int: ...


class RedisChannel(FrameChannel):
    """A session's frames through Redis: same ``emit``/``join``/``detach`` as ``FrameChannel``.

    ``seq`` is the last frame delivered to this instance's outboxes, in stream order; each outbox
    has a floor (the seq its first frames reached), below which later deliveries skip it.
    ``stale`` says another instance changed the session since it was loaded here.
    """

    def __init__(self, session_id: str, live: LiveSide) -> None:
        super().__init__(session_id, live.bus)
        self.live = live
        self.floors: dict[Outbox, int] = {}
        self.assigned_max = 0  # the highest seq given to a frame emitted here
        self.pending = 0  # frames emitted here still waiting for their seq
        self._settled = anyio.Event()
        self._settled.set()

    def emit(self, frame: Frame) -> Frame:
        if self.pending == 0:
            self._settled = anyio.Event()
        self.pending += 1
        self.live.enqueue(self, frame)
        return frame

    def assigned(self, frame: Frame, seq: int | None, frames: int = 1) -> None:
        """The flusher's answer: ``frame`` got ``seq`` (None: it never reached Redis); it stands for
        ``frames`` emitted frames (a run of chunks the appender joined)."""
        self.pending -= frames
        if self.pending == 0:
            self._settled.set()
        if seq is None:
            return
        frame["seq"] = seq
        self.assigned_max = max(self.assigned_max, seq)
        if not self.floors:
            self.seq = max(self.seq, seq)
        elif seq == self.seq + 1:  # nothing can be missing before it: no need to wait for the tail
            self.deliver(frame)

    def arrived(self, seq: int, origin: str, body: str) -> None:
        """A frame from the session's live channel or its stream, in seq order."""
        if seq <= self.seq:
            return
        if origin != self.live.instance:
            self.stale = True
        self.deliver({**json.loads(body), "seq": seq})

    def deliver(self, frame: Frame) -> None:
        self.seq = frame["seq"]
        packet = Packet.of(frame)  # serialized once for every local socket and the log
        self.log.append(self.seq, packet.text)
        for outbox, floor in self.floors.items():
            if self.seq > floor:
                outbox.push(packet)

    async def settle(self) -> None:
        """Wait until every frame emitted here has its seq (so memory and stream agree)."""
        while self.pending:
            await self._settled.wait()

    async def join(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
                   snapshot: Callable[[], list[Frame]],
                   turn: tuple[int, Callable[[], list[Frame]]] | None = None) -> bool:
        """Replay from Redis after ``last_seq``; else, for a turn running elsewhere, a snapshot
        without it and its frames from ``turn[0]``; else a snapshot. True when it was a replay."""
        if last_seq is not None:
            got = await self.live.read_after(self.session_id, last_seq)
            if got is not None and self._replay(outbox, got, [head(last_seq)]):
                return True
        if turn is not None:
            start, before = turn
            got = await self.live.read_after(self.session_id, start)
            if got is not None and self._replay(outbox, got, [head(start), *stamped(before(), start)]):
                return False
        end = await self.live.head_seq(self.session_id)
        await self.settle()
        floor = max(end, self.seq, self.assigned_max)
        self._add(outbox, [Packet.of(frame) for frame in (head(floor), *stamped(snapshot(), floor))], floor)
        return False

    def _replay(self, outbox: Outbox, got: tuple[list[Frame], int], first: list[Frame]) -> bool:
        frames, end = got
        packets = [Packet.of(frame) for frame in first + frames]
        if self.seq > end:  # delivered here while Redis was being read
            missing = self.log.after(end)
            if missing is None:
                return False
            packets, end = packets + missing, self.seq
        self._add(outbox, packets, end)
        return True

    def _add(self, outbox: Outbox, first: list[Packet], floor: int) -> None:
        for packet in first:
            outbox.push(packet)
        if not self.floors:
            self.seq = max(self.seq, floor)
            self.live.watch(self)
        self.floors[outbox] = floor

    def attach(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
               snapshot: Callable[[], list[Frame]]) -> bool:
        raise TypeError("a RedisChannel reads Redis to attach a client: use `await join(...)`")

    def detach(self, outbox: Outbox) -> bool:
        self.floors.pop(outbox, None)
        if not self.floors:
            self.live.unwatch(self)
        return not self.floors

    @property
    def watched(self) -> bool:
        return bool(self.floors)

    def lost(self, exc: BaseException) -> None:
        """Redis failed under this channel: tell its clients and close their sockets to resume."""
        body = {**error_frame(LiveUnavailable(f"the live stream is unavailable ({exc}); reconnecting")),
                "seq": self.seq}
        packet = Packet.of(body)
        for outbox in list(self.floors):
            outbox.push(packet)
            outbox.end("the live stream is unavailable; reconnect with last_seq")


def stamped(frames: list[Frame], seq: int) -> list[Frame]:
    return [{**frame, "seq": seq} for frame in frames]
