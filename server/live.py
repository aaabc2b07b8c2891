"""Live sessions: the in-memory side of a session that the store keeps durably.

A ``LiveSession`` numbers every frame it emits (``seq``), keeps the recent ones in a log so a client
that reconnects with ``last_seq`` receives exactly what it missed, and fans frames out to every
connected ``Outbox`` (several tabs may watch one session) and to the observer bus. The turn in
flight belongs to the session, not to a socket, so it survives a disconnect.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from server.events import EventBus
from server.history import BREADCRUMB_TEXT, ChatMessage
from server.routing import Route

FRAME_LOG_SIZE = 20000
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


@dataclass
class TurnHandle:
    turn_id: str
    cancel_scope: anyio.CancelScope
    done: anyio.Event = field(default_factory=anyio.Event)


class LiveSession:
    def __init__(self, session_id: str, title: str, route: Route, transcript: list[ChatMessage],
                 bus: EventBus) -> None:
        self.id = session_id
        self.title = title
        self.route = route
        self.transcript = transcript
        self.seq = 0
        self.log: deque[dict[str, Any]] = deque(maxlen=FRAME_LOG_SIZE)
        self.outboxes: set[Outbox] = set()
        self.turn: TurnHandle | None = None
        self.last_context: dict[str, Any] | None = None
        self.breadcrumb = ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True, id="breadcrumb-" + session_id)
        self.on_idle: Callable[[], None] | None = None
        self.streaming: tuple[ChatMessage, list[str]] | None = None  # the reply being written
        self._bus = bus

    def emit(self, frame: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        frame = {**frame, "seq": self.seq}
        self.log.append(frame)
        if frame["type"] == "context":
            self.last_context = frame
        for outbox in self.outboxes:
            outbox.push(frame)
        self._bus.publish(self.id, frame)
        return frame

    def replay_after(self, last_seq: int) -> list[dict[str, Any]] | None:
        """Frames after ``last_seq``, or None when the log no longer reaches back that far."""
        if last_seq > self.seq or last_seq < 0:
            return None
        if last_seq == self.seq:
            return []
        if not self.log or self.log[0]["seq"] > last_seq + 1:
            return None
        return [frame for frame in self.log if frame["seq"] > last_seq]

    def view(self) -> list[ChatMessage]:
        """What the next provider call sends: leading system messages, the breadcrumb when anything
        was trimmed or excluded, then every message still visible, in transcript order."""
        system = []
        index = 0
        while index < len(self.transcript) and self.transcript[index].role == "system":
            if not self.transcript[index].is_hidden:
                system.append(self.transcript[index])
            index += 1
        rest = self.transcript[index:]
        body = [m for m in rest if not m.is_hidden and not m.breadcrumb]
        hidden = any(m.is_hidden and not m.summary for m in rest)
        return system + ([self.breadcrumb] if hidden and body else []) + body

    def sync_streaming(self) -> None:
        if self.streaming is not None:
            message, parts = self.streaming
            message.set_content("".join(parts))

    @property
    def busy(self) -> bool:
        return self.turn is not None


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]
