"""The frame channel of one session: seq numbering, the resume log and the fan-out.

``FrameChannel.emit`` numbers every frame (``seq``), serializes it once into a ``Packet`` (the text
every socket sends; no encoding per connection), keeps the recent texts in a size-bounded
``FrameLog`` and pushes the packet to every attached ``Outbox`` (several tabs may watch one session)
and the frame to the observer bus. ``attach(outbox, last_seq, ...)`` decides what a joining client
receives first: the frames it missed, or a fresh snapshot when the log no longer reaches back.
``emit``, ``join`` (the awaitable ``attach``) and ``detach`` are the whole interface a shared bus
implements to spread a session over servers: ``live_channel.RedisChannel`` does, on Redis streams.

Sizes are true, not estimated: the log counts what its texts hold in memory (``sys.getsizeof`` plus
the deque slot and allocator rounding, measured with bench/memory.py), an outbox counts the bytes
each frame takes on the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import deque
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from server.sessions.events import EventBus

FRAME_LOG_BYTES = 2 * 1024 * 1024  # per session: long enough to resume a long reply
# Per logged text beyond sys.getsizeof: its deque slot (8.25 bytes) and pymalloc's rounding to
# 16 bytes (7.5 on average); measured with bench/memory.py.
LOG_ENTRY_OVERHEAD = 16
ASCII_STR_BYTES = sys.getsizeof("")  # an ASCII str holds this plus one byte per character
MAX_OUTBOX_BYTES = 8 * 1024 * 1024

Frame = dict[str, Any]


CHUNK_KEYS = ("type", "turn_id", "content", "seq")  # a chunk frame as the turn builds it, seq added


def serialize(frame: Frame) -> str:
    """The frame's compact JSON. A chunk frame (the hottest) is written here as ``json.dumps``
    writes it (same key order, same escapes: the C string encoder it calls with
    ``ensure_ascii=False``), at a seventh of its cost."""
    if frame["type"] == "chunk" and tuple(frame) == CHUNK_KEYS:
        turn_id, content, seq = frame["turn_id"], frame["content"], frame["seq"]
        if type(turn_id) is str and type(content) is str and type(seq) is int:
            return f'{{"type":"chunk","turn_id":{encode_basestring(turn_id)},' \
                   f'"content":{encode_basestring(content)},"seq":{seq}}}'
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def entry_bytes(text: str) -> int:
    """What one logged text holds in memory: ``sys.getsizeof`` of it, computed for an ASCII text
    (the usual frame) without the call, whose method lookup allocated on every chunk."""
    if text.isascii():
        return ASCII_STR_BYTES + len(text) + LOG_ENTRY_OVERHEAD
    return sys.getsizeof(text) + LOG_ENTRY_OVERHEAD


def wire_size(text: str) -> int:
    """UTF-8 bytes of ``text``; an ASCII string (the usual frame) is counted without encoding."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Packet:
    """One frame ready for the wire. ``frame`` is kept for a chunk only (coalescing joins chunks);
    a replayed packet has none, so resume sends exactly the frames that were logged."""

    __slots__ = ("seq", "text", "size", "frame")

    def __init__(self, seq: int, text: str, frame: Frame | None = None) -> None:
        self.seq = seq
        self.text = text
        self.size = len(text) if text.isascii() else wire_size(text)  # wire_size, a call less per chunk
        self.frame = frame

    @classmethod
    def of(cls, frame: Frame) -> Packet:
        return cls(frame.get("seq", 0), serialize(frame), frame if frame["type"] == "chunk" else None)

    def decoded(self) -> Frame:
        """The frame back from its text (tests and tools; never on the hot path)."""
        frame: Frame = json.loads(self.text)
        return frame


class Outbox:
    """Packets waiting for one socket's writer, bounded in wire bytes: a client that falls
    ``limit_bytes`` behind is cut off (``overflowed``) and resumes by seq when it reconnects."""

    def __init__(self, limit_bytes: int = MAX_OUTBOX_BYTES) -> None:
        self.frames: deque[Packet] = deque()
        self.limit_bytes = limit_bytes
        self.bytes = 0  # queued or taken by the writer and not yet handed to the socket
        # The writer's wake-up: a bare future, made only while the writer waits (an anyio Event per
        # wake-up, set on every push, was a twentieth of the server's CPU at 100 paced sessions).
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # get_running_loop() is a getpid() on 3.11
        self._overflowed = False
        # Called once, as the outbox overflows: the connection cancels its writer (a task waiting
        # for an event to do so was one of each socket's tasks).
        self.on_overflow: Callable[[], None] | None = None
        self.ending: str | None = None  # why the socket closes on purpose once what is queued is sent
        # Writes a frame's text to the socket at once if it takes it without waiting (True), set
        # by the connection that owns the outbox. Used only while the writer waits on an empty
        # queue, so nothing queued or in flight can come before the frame: the writer task's
        # wake-up and loop per chunk were a tenth of the server's busy samples (py-spy, 100 paced).
        self.direct: Callable[[str], bool] | None = None

    def end(self, reason: str) -> None:
        """Have the writer close the socket (1013) after what is queued; the client resumes by seq."""
        self.ending = reason
        self._wake()

    @property
    def overflowed(self) -> bool:
        return self._overflowed

    def push(self, packet: Packet) -> None:
        """Queue ``packet`` for the writer, or write it now when the writer waits and the socket
        takes it without waiting."""
        # A waiting writer has taken everything and sent it (the queue is empty, ending unset:
        # either would have woken it); a socket that must wait first (backpressure) gets the queue.
        if self._waiter is not None and self.direct is not None and self.direct(packet.text):
            return
        self.frames.append(packet)
        self.bytes += packet.size
        if self.bytes > self.limit_bytes and not self._overflowed:
            self._overflowed = True
            if self.on_overflow is not None:
                self.on_overflow()
        if self._waiter is not None:
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[Packet]:
        """Everything queued; the writer calls ``sent`` as each leaves."""
        packets = list(self.frames)
        self.frames.clear()
        return packets

    def sent(self, size: int) -> None:
        self.bytes -= size

    async def wait(self) -> None:
        while not self.frames and self.ending is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None


class FrameLog:
    """The texts of a session's most recent frames (consecutive seqs), bounded by the memory they
    hold, for replay to a reconnecting client."""

    def __init__(self, limit_bytes: int = FRAME_LOG_BYTES) -> None:
        self._texts: deque[str] = deque()  # only the texts: one object per logged frame
        self.first_seq = 0  # seq of the oldest text kept
        self.limit_bytes = limit_bytes
        self.bytes = 0

    def append(self, seq: int, text: str) -> None:
        if self._texts and seq != self.first_seq + len(self._texts):
            self.clear()  # a gap: the log cannot replay across it
        if not self._texts:
            self.first_seq = seq
        self._texts.append(text)
        # entry_bytes(text), its usual case written out: a call less per chunk
        ascii_bytes = ASCII_STR_BYTES + len(text) + LOG_ENTRY_OVERHEAD
        self.bytes += ascii_bytes if text.isascii() else entry_bytes(text)
        while self.bytes > self.limit_bytes and len(self._texts) > 1:
            self.bytes -= entry_bytes(self._texts.popleft())  # the same size it was counted with
            self.first_seq += 1

    def clear(self) -> None:
        self._texts.clear()
        self.bytes = 0

    def after(self, last_seq: int) -> list[Packet] | None:
        """Packets after ``last_seq``, or None when the log no longer reaches back that far."""
        if not self._texts or self.first_seq > last_seq + 1:
            return None
        skip = max(last_seq + 1 - self.first_seq, 0)
        texts = itertools.islice(self._texts, skip, None)
        return [Packet(seq, text) for seq, text in enumerate(texts, self.first_seq + skip)]

    def __len__(self) -> int:
        return len(self._texts)


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
        self.stale = False  # another instance changed the session (live mode: RedisChannel sets it)

    def emit(self, frame: Frame) -> Frame:
        self.seq = seq = self.seq + 1
        frame["seq"] = seq  # frames are built fresh for each emit; no copy on the hot path
        # Serialized once for every socket and the log (Packet.of, its seq known here).
        packet = Packet(seq, serialize(frame), frame if frame["type"] == "chunk" else None)
        self.log.append(seq, packet.text)
        for outbox in self._outboxes:
            outbox.push(packet)
        if packet.frame is None:  # the bus observes no chunk: a call less per chunk
            self._bus.publish(self.session_id, frame)
        return frame

    def replay_after(self, last_seq: int) -> list[Packet] | None:
        """Packets after ``last_seq``, or None when the log no longer reaches back that far."""
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
            first = [Packet.of(head(last_seq)), *replay]
        else:
            first = [Packet.of(frame) for frame in (head(self.seq), *snapshot())]
        for packet in first:
            outbox.push(packet)
        self._outboxes.add(outbox)
        return replay is not None

    async def join(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
                   snapshot: Callable[[], list[Frame]],
                   turn: tuple[int, Callable[[], list[Frame]]] | None = None) -> bool:
        """``attach`` for callers that also serve a shared channel (``live_channel.RedisChannel``),
        which reads Redis first; ``turn`` matters only there (a turn running on another instance)."""
        return self.attach(outbox, last_seq, head=head, snapshot=snapshot)

    def detach(self, outbox: Outbox) -> bool:
        """Leave the channel; True when nobody watches the session any more."""
        self._outboxes.discard(outbox)
        return not self._outboxes

    @property
    def watched(self) -> bool:
        return bool(self._outboxes)
