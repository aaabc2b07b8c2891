"""The hub's ``Instances`` in live mode (``[live] url``): one turn, one instance, over Redis.

``LiveInstances`` takes the session's lease before a turn (``Busy`` when any instance runs one),
and its ``LiveHold`` beats it while the turn runs and releases it after; it forwards ``stop`` to
the instance that holds the lease; answers the ``stop`` another instance forwards; closes the turn
of an instance that died (``instance_lost``); and tells a client joining mid-turn where the turn's
frames start. ``sessions`` is the hub's own cache (given by ``serve``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from server.errors import Busy, error_frame
from server.live.lease import Claim, InstanceLost, LiveUnavailable
from server.live.redis_live import RedisLive
from server.sessions.channel import Frame, FrameChannel
from server.sessions.instances import TurnElsewhere
from server.sessions.session import Session, TurnHandle
from server.sessions.views import history_frame

log = logging.getLogger(__name__)


def lost_turn(orphan: Claim) -> Frame:
    return error_frame(InstanceLost("the server writing this reply stopped; the text so far is kept, "
                                    "marked interrupted"), turn_id=orphan.turn_id)


class LiveHold:
    """The session's lease, held by this instance for one turn. The turn releases it just before
    its last frame (``Turn.last``), the hub again after the turn (a no-op then, but for dropping
    the session from the cache once nothing holds it here)."""

    def __init__(self, instances: LiveInstances, session: Session, claim: Claim) -> None:
        self.instances = instances
        self.session = session
        self.claim = claim
        self.released = False

    async def keep(self, handle: TurnHandle) -> None:
        await self.instances.heartbeat(self.session, handle, self.claim, lambda: self.released)

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self.instances.release(self.session, self.claim)
        self.instances.forget_idle(self.session)


class LiveInstances:
    store_at_once = True  # another instance can open a session only from the store

    def __init__(self, live: RedisLive) -> None:
        self.live = live
        self.sessions: dict[str, Session] = {}
        self.spawn: Callable[..., None] = lambda *args: None  # the hub's, once it serves

    def serve(self, sessions: dict[str, Session], spawn: Callable[..., None]) -> None:
        self.sessions = sessions
        self.spawn = spawn
        self.live.on_control = self.on_control
        self.live.on_orphan = lambda session_id, claim: spawn(self.take_over, session_id, claim)

    def channel(self, session_id: str, first_seq: int) -> FrameChannel:
        return self.live.channel(session_id)  # numbered by the shared stream, not from first_seq

    def shared_channel(self, session_id: str) -> FrameChannel | None:
        return self.live.channel(session_id)

    async def turn_running(self, session_id: str) -> bool:
        return await self.live.lease.holder(session_id) is not None

    def forget_idle(self, session: Session) -> None:
        """Keep only sessions watched or running here: another instance may change the rest, so
        they are read from the store again when next opened."""
        if session.channel.watched or session.turn is not None or session.has_unsaved:
            return  # a reply the store refused stays until UnsavedWriter writes it
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]

    async def turn_elsewhere(self, session: Session, page: int) -> TurnElsewhere | None:
        """A turn running on another instance: where its frames start, and the snapshot (the newest
        ``page`` messages) without it."""
        if session.turn is not None:
            return None
        claim = await self.live.lease.holder(session.id)
        if claim is None or claim.instance == self.live.instance:
            return None

        def before() -> list[Frame]:
            frame = history_frame(session, page)
            kept = [m for m in frame["messages"] if m.get("turn_id") != claim.turn_id]
            return [{**frame, "messages": kept}]
        return claim.start, before

    async def claim(self, session: Session, turn_id: str) -> LiveHold:
        """The session's lease for ``turn_id``, or ``Busy`` when a turn runs on any instance."""
        got = await self.live.lease.acquire(session.id, turn_id)
        if got is None:
            raise Busy("a reply is still being written in this session (on another server); stop it or wait")
        claim, orphan = got
        if orphan is not None:  # a dead instance's turn nobody closed: close it before the new one
            session.emit(lost_turn(orphan))
        return LiveHold(self, session, claim)

    async def release(self, session: Session, claim: Claim) -> None:
        try:
            await self.live.lease.release(session.id, claim)
        except LiveUnavailable as exc:  # the lease expires by itself
            log.warning("live: lease of session %s not released: %s", session.id, exc)

    async def heartbeat(self, session: Session, handle: TurnHandle, claim: Claim,
                        released: Callable[[], bool]) -> None:
        """Extend the lease while the turn runs; stop the turn when the lease is no longer ours
        (not when the turn let it go itself, ending)."""
        beat = self.live.lease.ttl_ms / 3000
        while not handle.done.is_set():
            with anyio.move_on_after(beat):
                await handle.done.wait()
            if handle.done.is_set() or released():
                return
            try:
                ours = await self.live.lease.extend(session.id, claim)
            except LiveUnavailable:
                continue  # Redis is away (the tail tells the clients); try again next beat
            if not ours:
                if not released():  # taken over: another instance closed this turn; stop writing it
                    log.warning("live: lease of turn %s lost; stopping it", claim.turn_id)
                    handle.cancel_scope.cancel()
                return

    async def stop_elsewhere(self, session_id: str) -> None:
        claim = await self.live.lease.holder(session_id)
        if claim is not None and claim.instance != self.live.instance:
            await self.live.send_control(claim.instance, {"op": "stop", "session_id": session_id,
                                                          "turn_id": claim.turn_id})

    def forward_decision(self, session_id: str, turn_id: str, call_id: str, allow: bool) -> bool:
        self.spawn(self.decide_remote, session_id, turn_id, call_id, allow)
        return True

    async def decide_remote(self, session_id: str, turn_id: str, call_id: str, allow: bool) -> None:
        """An answer to a tool approval, for the instance whose turn asked (an answer nobody waits
        for there is dropped: the question was answered, timed out or its turn ended)."""
        claim = await self.live.lease.holder(session_id)
        if claim is not None and claim.instance != self.live.instance and claim.turn_id == turn_id:
            await self.live.send_control(claim.instance, {"op": "decide", "session_id": session_id,
                                                          "turn_id": turn_id, "id": call_id,
                                                          "allow": allow is True})

    def on_control(self, message: dict[str, Any]) -> None:
        """A request from another instance for a turn running here."""
        session = self.sessions.get(str(message.get("session_id")))
        if session is None or session.turn is None or session.turn.turn_id != message.get("turn_id"):
            return
        if message.get("op") == "stop":
            session.turn.cancel_scope.cancel()
        elif message.get("op") == "decide":
            session.approvals.decide(str(message.get("turn_id")), str(message.get("id")),
                                     message.get("allow") is True)

    async def take_over(self, session_id: str, orphan: Claim) -> None:
        """The instance running a turn died: close the turn (its reply so far is in the store,
        marked interrupted) and tell every client of the session."""
        claim = await self.live.lease.take_over(session_id, orphan, uuid.uuid4().hex[:12])
        if claim is None:
            return  # another instance did it, or the turn came back to life
        try:
            channel = self.live.channel(session_id)
            channel.stale = True  # the store holds what the lost instance flushed
            log.warning("live: instance %s lost turn %s of session %s; closing it", orphan.instance,
                        orphan.turn_id, session_id)
            channel.emit(lost_turn(orphan))
            await channel.settle()
        finally:
            await self.live.lease.release(session_id, claim)
