"""The session hub: routes what clients ask to the session it concerns.

Every client request that changes a session goes through here, validated before anything changes:
a message becomes a durable user message and a ``Turn``; ``/model <route>`` and ``switch_model``
change the session's route (a turn in flight finishes on the route it started with); ``stop``
cancels the turn from any connected client. The hub's parts: ``SessionCache`` (session_cache.py)
finds, creates, caches and evicts sessions, ``Restores`` (restore.py) readies a stored session for
its first client, ``UnsavedWriter`` (unsaved.py) writes again what the store refused.

What other instances share (live mode, ``[live] url``) goes through the hub's ``Instances``
(instances.py): ``SoleInstance`` for one process, ``server.live.turns.LiveInstances`` on Redis,
which holds the lease of each turn, forwards ``stop`` and closes the turns of an instance that
died (docs/deployment.md). The hub reads the same in both modes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from server.errors import BadFrame, Busy, StoreUnavailable, UnknownRoute, UnknownSession, error_frame
from server.history.messages import ChatMessage, Image
from server.protocol import EDIT_PREVIEW, ImagePayload, echo, server_frame
from server.routing.resolver import Route
from server.sessions.cache import DEFAULT_TITLE, SessionCache
from server.sessions.channel import Frame, Outbox
from server.sessions.compaction_runner import compaction_for
from server.sessions.counting import Counts
from server.sessions.images import decode_images
from server.sessions.instances import SOLE_HOLD, Hold, Instances, SoleInstance
from server.sessions.quota import Quota
from server.sessions.runtime import Runtime
from server.sessions.session import Session, TurnHandle, utc_now
from server.sessions.set_aside import estimate_without, turns_from
from server.sessions.turn import Turn
from server.sessions.unsaved import UnsavedWriter
from server.sessions.versions import Replaces
from server.sessions.views import history_frame, history_page_frame, image_urls, session_frame

log = logging.getLogger(__name__)

MODEL_COMMAND = "/model"
TITLE_CHARS = 60  # of the first message, as the session's title


def first_title(text: str) -> str:
    """A session's title from its first message: the text on one line, cut at 60 characters."""
    return " ".join(text.split())[:TITLE_CHARS]


class SessionHub:
    def __init__(self, rt: Runtime, instances: Instances | None = None) -> None:
        self.rt = rt
        self.instances = instances or SoleInstance(rt.bus)
        self.cache = SessionCache(rt, self.instances)
        self.instances.serve(self.cache.sessions, self.spawn)
        self.unsaved = UnsavedWriter(self.spawn)
        self.compaction = compaction_for(rt.options)
        self.counts = Counts(rt)  # the provider's count of each session's next request, between turns
        self.quota = Quota(rt.settings.auth, rt.store)  # a signed-in user's turns and daily tokens
        self.coalesce_seconds = rt.settings.server.coalesce_ms / 1000
        self.connections = 0

    # --- the connection cap -------------------------------------------------------------------

    def admit(self) -> bool:
        """Count one more open socket, or refuse it at ``server.max_connections``."""
        if self.connections >= self.rt.settings.server.max_connections:
            return False
        self.connections += 1
        return True

    def release(self) -> None:
        self.connections -= 1

    # --- finding sessions (session_cache.py) ----------------------------------------------------

    async def messages_of(self, session_id: str, owner: str | None = None) -> list[ChatMessage]:
        """A session's transcript, for its image URLs (``owner``: as ``attach``)."""
        return await self.cache.messages_of(session_id, owner)

    # --- clients joining and leaving ----------------------------------------------------------

    async def attach(self, outbox: Outbox, session_id: str | None, last_seq: int | None,
                     owner: str | None = None) -> Session:
        """Open the session and put its first frames in ``outbox``: the ``session`` frame, then
        the frames missed since ``last_seq`` or a ``history`` snapshot. With an ``owner``
        (accounts), another user's session id opens a new session, as an unknown id does."""
        session = await self.cache.open(session_id, owner)
        resumed = session_id == session.id
        routes = self.rt.resolver.routes()
        page = self.rt.settings.server.history_page_messages
        replayed = await session.channel.join(
            outbox, last_seq if resumed else None,
            head=lambda seq: session_frame(session, resumed=resumed, seq=seq, routes=routes),
            snapshot=lambda: [history_frame(session, page)],
            turn=await self.instances.turn_elsewhere(session, page))
        if not replayed:
            # In the background: a window discovery on a slow provider must not hold the reader.
            self.spawn(self.after_hello, session)
        return session

    def detach(self, session: Session, outbox: Outbox) -> None:
        """A client left; with nobody watching, the turn stops unless ``server.keep_generating``."""
        session = self.cache.cached(session)
        if session.channel.detach(outbox):
            if not self.rt.settings.server.keep_generating:
                self.stop(session, remote=False)
            self.instances.forget_idle(session)

    async def after_hello(self, session: Session) -> None:
        """Announce the restore trim (once) and send the meter for the session's route (and, for a
        user with a daily budget, what is left of it)."""
        if not await self.cache.restores.announce(session):
            await session.emit_meter(session.route, "hello")
        self.counts.request(session)
        await self.send_budget(session)

    async def send_budget(self, session: Session) -> None:
        frame = await self.quota.frame(session.owner)
        if frame is not None:
            session.emit(frame)

    async def drain(self, grace: float) -> None:
        """The server is shutting down: end every ``/events`` stream, stop every turn and wait (at
        most ``grace`` seconds) until each has written its reply, marked interrupted."""
        self.rt.bus.close()
        sessions = self.cache.sessions
        handles = [session.turn for session in sessions.values() if session.turn is not None]
        for session in sessions.values():
            self.stop(session, remote=False)  # only the turns this instance runs
        with anyio.move_on_after(grace):
            for handle in handles:
                await handle.done.wait()
            for session in sessions.values():
                await self.unsaved.last_try(session)

    def deleted(self, session_id: str) -> None:
        """The session was deleted through the API: stop its turn and tell its open tabs."""
        session = self.cache.sessions.pop(session_id, None)
        if session is not None:
            self.stop(session)
        channel = session.channel if session else self.cache.shared_channel(session_id)
        if channel is not None:
            channel.emit(error_frame(UnknownSession("this session was deleted; start a new chat")))
        if session is None:
            self.spawn(self.instances.stop_elsewhere, session_id)

    async def renamed(self, session_id: str) -> None:
        """The session was renamed through the API: its open tabs (on any instance) show the new title."""
        session = self.cache.sessions.get(session_id)
        channel = session.channel if session else self.cache.shared_channel(session_id)
        summary = await self.rt.store.get_summary(session_id) if channel else None
        if channel is not None and summary is not None:
            if session is not None:
                session.title = summary.title
            channel.emit(server_frame("title", title=summary.title))

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``fn`` in the app's task group; a failure is logged, never allowed to stop the server."""
        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

        self.rt.task_group.start_soon(guarded)

    # --- requests -----------------------------------------------------------------------------

    async def switch(self, session: Session, route_text: str) -> None:
        session = await self.cache.current(session)
        route = self.rt.resolver.parse(route_text.strip(), kind="switch")
        session.route = route
        if session.stored:  # a session not yet stored takes its route along when it is
            await self.rt.store.set_route(session.id, route.name)
        await session.emit_meter(route, "switch")  # the page confirms the switch from this frame
        await session.save_notices()  # the confirmation comes back on a reload
        self.counts.request(session)

    async def model_command(self, session: Session, route_text: str) -> None:
        """``/model X`` typed in the composer: a route that does not exist (or none) is answered
        with the routes that do, as a notice, not an error."""
        routes = ", ".join(self.rt.resolver.routes())
        session.keep_notice({"type": "command", "content": f"{MODEL_COMMAND} {route_text.strip()}".strip()})
        if not route_text.strip():
            message = f"/model needs a route: one of {routes}"
        else:
            try:
                return await self.switch(session, route_text)
            except UnknownRoute as exc:
                message = f"{exc.message}. Routes: {routes}"
        session.emit(server_frame("notice", code="unknown_route", message=message))
        await session.save_notices()

    def history_before(self, session: Session, before_id: str, limit: int | None) -> Frame:
        """An older page of the session's history, for the one client that asked."""
        page = self.rt.settings.server.history_page_messages
        return history_page_frame(session, before_id, min(limit or page, page))

    def stop(self, session: Session, remote: bool = True) -> None:
        """Cancel the session's turn: here, or (``remote``) on the instance that runs it."""
        session = self.cache.cached(session)
        if session.turn is not None:
            session.turn.cancel_scope.cancel()
        elif remote:
            self.spawn(self.instances.stop_elsewhere, session.id)

    def decide(self, session: Session, turn_id: str, call_id: str, allow: bool) -> None:
        """The user's answer to a call waiting for approval (allow once, or deny)."""
        session = self.cache.cached(session)
        if session.approvals.decide(turn_id, call_id, allow):
            return
        if session.turn is None and self.instances.forward_decision(session.id, turn_id, call_id, allow):
            return  # the turn may run on another instance
        raise BadFrame(f"tool_decision: no call {echo(call_id)} of turn {echo(turn_id)} waits for an "
                       f"answer (it was answered, timed out or its turn ended)")

    async def submit(self, session: Session, message_id: str, content: str,
                     payloads: list[ImagePayload], retry_of: str | None = None,
                     edit_of: str | None = None) -> None:
        session = await self.cache.current(session)
        if message_id in session.client_ids:
            return  # a client resending after a reconnect: the message is already durable
        if content.strip().split(" ", 1)[0] == MODEL_COMMAND:
            await self.model_command(session, content.strip()[len(MODEL_COMMAND):])
            return
        if session.busy:
            raise Busy("a reply is still being written in this session; stop it or wait for it to finish")
        if session.knows(message_id):
            raise BadFrame(f"message.id {message_id!r} is already used by another message in this session")
        if session.owner is not None:
            await self.quota.check_budget(session.owner)
        if session.has_unsaved:
            await session.save_reply()  # the earlier reply first, or StoreUnavailable and nothing stored
        replaces = Replaces.of(session, retry_of, edit_of)
        images = decode_images(payloads, self.rt.options.max_image_bytes)
        turn_id = uuid.uuid4().hex[:12]
        if session.owner is not None:  # no await from here to the claim: two tabs cannot both pass
            self.quota.check_turns(session.owner, self.cache.sessions.values())
        # Claim the session before the first await: two tabs sending at once start one turn.
        handle = session.turn = TurnHandle(turn_id, anyio.CancelScope())
        hold: Hold | None = None
        untitled = session.title == DEFAULT_TITLE
        try:
            hold = await self.instances.claim(session, turn_id)
            route, text = await self._accept(session, message_id, content, images, turn_id, replaces)
        except BaseException:
            session.turn = None
            if hold is not None:  # claimed, then the message was refused
                with anyio.CancelScope(shield=True):
                    await hold.release()
            raise
        if untitled and text.strip():  # the first message names the session
            await self._retitle(session, first_title(text))
        turn = Turn(self.rt, session, turn_id, route, self.compaction)
        turn.let_go = hold.release
        if hold is not SOLE_HOLD:  # one process: the session's turn is the whole hold
            self.spawn(hold.keep, handle)
        self.spawn(self._run_turn, session, turn, handle, hold)

    async def _accept(self, session: Session, message_id: str, content: str, images: list[Image],
                      turn_id: str, replaces: Replaces | None) -> tuple[Route, str]:
        """Take the user's message into the session and announce it. Its write runs beside the
        provider call (``Session.store_soon``); the turn's reply save writes it first if it has not
        landed, so it is stored before the reply and before ``done``."""
        route, text = self.rt.resolver.for_message(session.route, content)
        if replaces is not None:
            await replaces.set_aside(session, text)
        user = ChatMessage("user", text, images=images or None, turn_id=turn_id, id=message_id,
                           created_at=utc_now(), replaces=replaces.turn_id if replaces else None)
        await self._store_new(session, text)
        session.add(user)
        if session.writes is not None:  # until the turn's first chunk is out (Turn.call releases them)
            session.writes.hold()
        session.store_soon(user)
        session.client_ids.add(message_id)
        session.emit(server_frame(
            "accepted", id=message_id, turn_id=turn_id, content=text, images=len(images) or None,
            created_at=user.created_at, image_urls=image_urls(session.id, user),
            **(replaces.echo() if replaces else {})))
        return route, text

    async def preview_edit(self, session: Session, turn_id: object) -> Frame:
        """The meter as it would read with ``turn_id`` and every later turn set aside (an edit of
        that turn's message), for the asking client only: nothing changes."""
        turns = turns_from(session, Replaces.checked("preview_edit.turn_id", turn_id))
        if not turns:
            raise BadFrame(f"preview_edit.turn_id: no turn {echo(turn_id)} in this session")
        meter = self.rt.meter
        reading = await meter.read(session.route, estimate_without(session, turns),
                                   meter.tools(session.route),
                                   session.anchors.get(session.route.name))  # the meter's own accounting
        frame = meter.frame(reading, session.ledger, EDIT_PREVIEW)
        frame.pop("trim_preview", None)  # the ledger's preview is of the history before the edit
        return frame

    async def _store_new(self, session: Session, text: str) -> None:
        """Store a session not stored yet, titled by its first message: one write, not two."""
        if session.stored or session.title != DEFAULT_TITLE or not text.strip():
            await self.cache.store_new(session)
            return
        session.title = first_title(text)
        try:
            await self.cache.store_new(session)
        except BaseException:
            session.title = DEFAULT_TITLE  # not stored: the next message titles it again
            raise

    async def _retitle(self, session: Session, title: str) -> None:
        if session.title != title:  # stored already (with another instance), so renamed here
            session.title = title
            await self.rt.store.rename_session(session.id, title)
        session.emit(server_frame("title", title=title))

    async def _run_turn(self, session: Session, turn: Turn, handle: TurnHandle, hold: Hold) -> None:
        try:
            if turn.route != session.route:
                await turn.emit_meter("hint")
            with handle.cancel_scope:
                await turn.run()
            if handle.cancel_scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._abort(turn)
        finally:
            session.turn = None
            handle.done.set()
            with anyio.CancelScope(shield=True):
                await hold.release()
                await session.save_notices()  # the turn's errors and notices, for a reload
            self.unsaved.after_turn(session)
        if turn.route != session.route:
            await session.emit_meter(session.route, "done")
        self.counts.request(session)
        if session.owner is not None:  # only a signed-in user has a daily budget
            self.spawn(self.send_budget, session)

    async def _abort(self, turn: Turn) -> None:
        try:
            await turn.finish_reply(interrupted=True)
        except StoreUnavailable:
            pass  # kept in session.unsaved; self.unsaved writes it
        await turn.last(server_frame("aborted", turn_id=turn.turn_id))
