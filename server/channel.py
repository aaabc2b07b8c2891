"""The frame channel of one session: seq numbering, the resume log and the fan-out.

``FrameChannel.emit`` numbers every frame (``seq``), keeps the recent ones in a size-bounded
``FrameLog`` and pushes them to every attached ``Outbox`` (several tabs may watch one session) and to
the observer bus. ``attach(outbox, last_seq, ...)`` decides what a joining client receives first: the
frames it missed, or a fresh snapshot when the log no longer reaches back. ``emit``, ``join`` (the
awaitable ``attach``) and ``detach`` are the whole interface a shared bus implements to spread a
session over servers: ``live_redis.RedisChannel`` does, on Redis streams.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from server.events import EventBus

FRAME_LOG_BYTES = 2 * 1024 * 1024  # per session: long enough to resume a long reply
FRAME_OVERHEAD_BYTES = 320  # what a small frame dict costs in memory (measured: bench/memory.py)
OUTBOX_LIMIT = 50000

Frame = dict[str, Any]


class Outbox:
    """Frames waiting for one socket's writer."""

    def __init__(self) -> None:
        self.frames: deque[Frame] = deque()
        self._ready = anyio.Event()
        self.overflowed = False
        self.ending = False  # closing on purpose: what is queued is still sent
        self.close_reason = "client too slow; reconnect with last_seq"

    def end(self, reason: str) -> None:
        """Have the writer close the socket after what is queued; the client resumes by seq."""
        self.close_reason = reason
        self.overflowed = self.ending = True
        self._ready.set()

    def push(self, frame: Frame) -> None:
        if len(self.frames) >= OUTBOX_LIMIT:
            self.overflowed = True  # the writer closes the socket; the client resumes by seq
        self.frames.append(frame)
        self._ready.set()

    async def wait(self) -> None:
        while not self.frames and not self.overflowed:
            await self._ready.wait()
            self._ready = anyio.Event()


def frame_bytes(frame: Frame) -> int:
    """A cheap stand-in for a frame's size: its texts plus a fixed overhead."""
    size = FRAME_OVERHEAD_BYTES
    for key in ("content", "output", "full_response", "message"):
        value = frame.get(key)
        if isinstance(value, str):
            size += len(value)
    return size


class FrameLog:
    """The most recent frames of a session, bounded by size, for replay to a reconnecting client."""

    def __init__(self, limit_bytes: int = FRAME_LOG_BYTES) -> None:
        self._frames: deque[tuple[Frame, int]] = deque()
        self.limit_bytes = limit_bytes
        self.bytes = 0

    def append(self, frame: Frame) -> None:
        size = frame_bytes(frame)
        self._frames.append((frame, size))
        self.bytes += size
        while self.bytes > self.limit_bytes and len(self._frames) > 1:
            self.bytes -= self._frames.popleft()[1]

    def after(self, last_seq: int) -> list[Frame] | None:
        """Frames after ``last_seq``, or None when the log no longer reaches back that far."""
        if not self._frames or self._frames[0][0]["seq"] > last_seq + 1:
            return None
        return [frame for frame, _ in self._frames if frame["seq"] > last_seq]

    def __len__(self) -> int:
        return len(self._frames)


class FrameChannel:
    """Numbers, logs and fans out the frames of one session.

    ``first_seq`` is where this incarnation of the session started numbering; a ``last_seq`` below
    it (or above ``seq``) came from another incarnation and is never replayed against this log.
    """

    def __init__(self, session_id: str, bus: EventBus, first_seq: int = 0) -> None:
        self.session_id = session_id
        self.first_seq = self.seq = first_seq
        self.log = FrameLog()
        self._outboxes: set[Outbox] = set()
        self._bus = bus

    def emit(self, frame: Frame) -> Frame:
        self.seq += 1
        frame["seq"] = self.seq  # frames are built fresh for each emit; no copy on the hot path
        self.log.append(frame)
        for outbox in self._outboxes:
            outbox.push(frame)
        self._bus.publish(self.session_id, frame)
        return frame

    def replay_after(self, last_seq: int) -> list[Frame] | None:
        """Frames after ``last_seq``, or None when the log no longer reaches back that far."""
        if last_seq > self.seq or last_seq < self.first_seq:
            return None  # a number from another incarnation of this session (or none at all)
        if last_seq == self.seq:
            return []
        return self.log.after(last_seq)

    def attach(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
               snapshot: Callable[[], list[Frame]]) -> bool:
        """Join ``outbox`` and give it what comes first: ``head(last_seq)`` and the frames missed
        since, or ``head(seq)`` and ``snapshot()`` when there is nothing to replay from. Returns
        whether it was a replay. Synchronous on purpose: no frame can fall in between."""
        replay = self.replay_after(last_seq) if last_seq is not None else None
        if replay is not None and last_seq is not None:
            first = [head(last_seq), *replay]
        else:
            first = [head(self.seq), *snapshot()]
        for frame in first:
            outbox.push(frame)
        self._outboxes.add(outbox)
        return replay is not None

    async def join(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
                   snapshot: Callable[[], list[Frame]],
                   turn: tuple[int, Callable[[], list[Frame]]] | None = None) -> bool:
        """``attach`` for callers that also serve a shared channel (``live_redis.RedisChannel``),
        which reads Redis first; ``turn`` matters only there (a turn running on another instance)."""
        return self.attach(outbox, last_seq, head=head, snapshot=snapshot)

    def detach(self, outbox: Outbox) -> bool:
        """Leave the channel; True when nobody watches the session any more."""
        self._outboxes.discard(outbox)
        return not self._outboxes

    @property
    def watched(self) -> bool:
        return bool(self._outboxes)
