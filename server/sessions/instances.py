"""``Instances``: what the hub asks of the other server instances that share its sessions, and
``SoleInstance``, the answer when there are none (one process, no ``[live] url``).

The hub always has an ``Instances`` (like ``NoCompaction`` for compaction), so it reads the same in
both modes: ``server.live.turns.LiveInstances`` answers through Redis, ``SoleInstance`` at once.

- ``channel``: a session's frame channel (a ``RedisChannel`` shared by every instance, or this
  process's ``FrameChannel``); ``shared_channel``: one for a session not cached here, when other
  instances may have it open (None alone).
- ``claim``: a ``Hold`` on the session for one turn (``Busy`` when any instance runs one); the hub
  keeps it while the turn runs (``keep``) and lets go after (``release``).
- ``turn_elsewhere``: a turn another instance runs, for a client joining mid-turn.
- ``stop_elsewhere``: forward ``stop`` to the instance that runs the session's turn.
- ``forward_decision``: send a tool approval's answer to the instance that runs the turn; False
  when no other instance can run one (then nobody waits for it).
- ``turn_running``: whether any instance holds the session for a turn (a restore leaves its
  unanswered tool calls alone then).
- ``forget_idle``: drop a cached session nobody watches here (another instance may change it).
- ``store_at_once``: a new session is stored when it is created, so another instance can open it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from server.sessions.channel import Frame, FrameChannel
from server.sessions.events import EventBus
from server.sessions.session import Session, TurnHandle

# Where a turn running elsewhere starts in the stream, and the snapshot without it.
TurnElsewhere = tuple[int, Callable[[], list[Frame]]]


class Hold(Protocol):
    async def keep(self, handle: TurnHandle) -> None:
        """Keep the hold while ``handle``'s turn runs; cancel the turn if the hold is lost."""

    async def release(self) -> None:
        """The turn ended: let another turn (on any instance) begin."""


class Instances(Protocol):
    store_at_once: bool

    def serve(self, sessions: dict[str, Session], spawn: Callable[..., None]) -> None: ...

    def channel(self, session_id: str, first_seq: int) -> FrameChannel: ...

    def shared_channel(self, session_id: str) -> FrameChannel | None: ...

    async def claim(self, session: Session, turn_id: str) -> Hold: ...

    async def turn_elsewhere(self, session: Session, page: int) -> TurnElsewhere | None: ...

    async def stop_elsewhere(self, session_id: str) -> None: ...

    def forward_decision(self, session_id: str, turn_id: str, call_id: str, allow: bool) -> bool: ...

    async def turn_running(self, session_id: str) -> bool: ...

    def forget_idle(self, session: Session) -> None: ...


class SoleHold:
    """One process: the hub's ``session.turn`` is the whole hold."""

    async def keep(self, handle: TurnHandle) -> None:
        return None

    async def release(self) -> None:
        return None


SOLE_HOLD = SoleHold()


class SoleInstance:
    store_at_once = False  # an opened page leaves no empty session: stored with its first message

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus

    def serve(self, sessions: dict[str, Session], spawn: Callable[..., None]) -> None:
        return None

    def channel(self, session_id: str, first_seq: int) -> FrameChannel:
        return FrameChannel(session_id, self.bus, first_seq)

    def shared_channel(self, session_id: str) -> FrameChannel | None:
        return None

    async def claim(self, session: Session, turn_id: str) -> Hold:
        return SOLE_HOLD

    async def turn_elsewhere(self, session: Session, page: int) -> TurnElsewhere | None:
        return None

    async def stop_elsewhere(self, session_id: str) -> None:
        return None

    def forward_decision(self, session_id: str, turn_id: str, call_id: str, allow: bool) -> bool:
        return False

    async def turn_running(self, session_id: str) -> bool:
        return False  # the cache holds every session with a running turn

    def forget_idle(self, session: Session) -> None:
        return None

