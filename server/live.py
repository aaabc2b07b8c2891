"""Live sessions: the in-memory side of a session that the store keeps durably.

A ``LiveSession`` numbers every frame it emits (``seq``), keeps the recent ones in a log so a client
that reconnects with ``last_seq`` receives exactly what it missed, and fans frames out to every
connected ``Outbox`` (several tabs may watch one session) and to the observer bus. The turn in
flight belongs to the session, not to a socket, so it survives a disconnect.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from server.compaction import TRUNCATED
from server.events import EventBus
from server.history import BREADCRUMB_TEXT, DEFAULT_IMAGE_TOKEN_COST, ChatMessage
from server.ledger import HistoryLedger
from server.routing import Route

FRAME_LOG_BYTES = 2 * 1024 * 1024  # per session: long enough to resume a long reply
FRAME_OVERHEAD_BYTES = 320  # what a small frame dict costs in memory (measured: bench/memory.py)
OUTBOX_LIMIT = 50000


class Outbox:
    """Frames waiting for one socket's writer."""

    def __init__(self) -> None:
        self.frames: deque[dict[str, Any]] = deque()
        self._ready = anyio.Event()
        self.overflowed = False

    def push(self, frame: dict[str, Any]) -> None:
        if len(self.frames) >= OUTBOX_LIMIT:
            self.overflowed = True  # the writer closes the socket; the client resumes by seq
        self.frames.append(frame)
        self._ready.set()

    async def wait(self) -> None:
        while not self.frames and not self.overflowed:
            await self._ready.wait()
            self._ready = anyio.Event()


def frame_bytes(frame: dict[str, Any]) -> int:
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
        self._frames: deque[tuple[dict[str, Any], int]] = deque()
        self.limit_bytes = limit_bytes
        self.bytes = 0

    def append(self, frame: dict[str, Any]) -> None:
        size = frame_bytes(frame)
        self._frames.append((frame, size))
        self.bytes += size
        while self.bytes > self.limit_bytes and len(self._frames) > 1:
            self.bytes -= self._frames.popleft()[1]

    def after(self, last_seq: int) -> list[dict[str, Any]] | None:
        """Frames after ``last_seq``, or None when the log no longer reaches back that far."""
        if not self._frames or self._frames[0][0]["seq"] > last_seq + 1:
            return None
        return [frame for frame, _ in self._frames if frame["seq"] > last_seq]

    def __len__(self) -> int:
        return len(self._frames)


@dataclass
class TurnHandle:
    turn_id: str
    cancel_scope: anyio.CancelScope
    done: anyio.Event = field(default_factory=anyio.Event)


class LiveSession:
    def __init__(self, session_id: str, title: str, route: Route, transcript: list[ChatMessage],
                 bus: EventBus, image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST, first_seq: int = 0) -> None:
        self.id = session_id
        self.title = title
        self.route = route
        self.transcript = transcript
        self.first_seq = self.seq = first_seq
        self.log = FrameLog()
        self.outboxes: set[Outbox] = set()
        self.turn: TurnHandle | None = None
        self.breadcrumb = ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True, id="breadcrumb-" + session_id)
        self.streaming: tuple[ChatMessage, list[str]] | None = None  # the reply being written
        self.client_ids = {m.id for m in transcript if m.role == "user"}  # resends are ignored
        self.image_token_cost = image_token_cost
        self._bus = bus
        self.ledger = HistoryLedger(self._scan(), image_token_cost=image_token_cost)

    def emit(self, frame: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        frame["seq"] = self.seq  # frames are built fresh for each emit; no copy on the hot path
        self.log.append(frame)
        for outbox in self.outboxes:
            outbox.push(frame)
        self._bus.publish(self.id, frame)
        return frame

    def replay_after(self, last_seq: int) -> list[dict[str, Any]] | None:
        """Frames after ``last_seq``, or None when the log no longer reaches back that far."""
        if last_seq > self.seq or last_seq < self.first_seq:
            return None  # a number from another incarnation of this session (or none at all)
        if last_seq == self.seq:
            return []
        return self.log.after(last_seq)

    def _scan(self) -> list[ChatMessage]:
        """The sendable history read off the transcript: leading system messages, the breadcrumb
        when trimming or truncation left older turns out, then every message still visible, in
        transcript order. Linear in the transcript: it runs on load and after compaction, a
        set-aside or a retry, never per call (the ledger carries the history between those)."""
        transcript = self.transcript
        end = 0
        while end < len(transcript) and transcript[end].role == "system":
            end += 1
        system = [m for m in transcript[:end] if not m.is_hidden]
        rest = transcript[end:]
        body = [m for m in rest if not m.is_hidden and not m.breadcrumb]
        if self.streaming is not None and body and body[-1] is self.streaming[0]:
            body.pop()  # the reply being written joins the ledger when it is complete
        # Turns set aside (refused, retried, orphaned) are not "omitted to fit the window".
        left_out = any(m.trimmed or m.excluded == TRUNCATED for m in rest)
        crumb = [self.breadcrumb] if left_out and body and not any(m.summary for m in body) else []
        return system + crumb + body

    def rebuild(self) -> None:
        """Re-read the ledger after marks changed outside a trim (compaction, restore, set-aside)."""
        self.ledger = HistoryLedger(self._scan(), image_token_cost=self.image_token_cost)

    def view(self) -> list[ChatMessage]:
        """What the next provider call sends (the ledger keeps it and its estimate current)."""
        return self.ledger.messages()

    def add(self, *messages: ChatMessage, sendable: bool = True) -> None:
        """Append to the transcript; ``sendable=False`` for a reply still being written, which
        ``complete`` later hands to the ledger."""
        self.transcript.extend(messages)
        if sendable:
            self.ledger.extend(messages)

    def complete(self, message: ChatMessage, *, listed: bool) -> None:
        """A reply is finished: into the ledger (and the transcript, unless already ``listed``)."""
        if not listed:
            self.transcript.append(message)
        self.ledger.append(message)

    def sync_streaming(self) -> None:
        if self.streaming is not None:
            message, parts = self.streaming
            message.set_content("".join(parts))

    @property
    def busy(self) -> bool:
        return self.turn is not None


def dropped_ids(messages: list[ChatMessage]) -> dict[str, list[str]]:
    """``message_ids`` and ``turn_ids`` (in order, once each) of a ``history_trimmed`` frame."""
    turns = list(dict.fromkeys(m.turn_id for m in messages if m.turn_id))
    return {"message_ids": [m.id for m in messages], "turn_ids": turns}


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]
