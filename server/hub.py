"""The session hub: finds, creates, caches and evicts sessions, and routes what clients ask.

Every client request that changes a session goes through here, validated before anything changes:
a message becomes a durable user message and a ``Turn``; ``/model <route>`` and ``switch_model``
change the session's route (a turn in flight finishes on the route it started with); ``stop``
cancels the turn from any connected client. A stored session is restored with the turn limit and
the orphan sweep applied, and the trim is announced to the first client that opens it.

Live mode (``[live] url``, several instances): sessions' channels are ``RedisChannel``s, a session
another instance changed is read again from the store before it is used here, and ``LiveTurns``
(live_turns.py) holds the lease of each turn, forwards ``stop`` and closes the turns of an instance
that died (docs/deployment.md).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from server.channel import Frame, FrameChannel, Outbox
from server.compaction_runner import compaction_for
from server.errors import BadFrame, Busy, StoreUnavailable, UnknownRoute, UnknownSession, error_frame
from server.history import ChatMessage, Image
from server.images import decode_images
from server.lease import Claim
from server.live_channel import RedisChannel
from server.live_redis import RedisLive
from server.live_turns import LiveTurns
from server.protocol import EDIT_PREVIEW, ImagePayload, echo, server_frame
from server.routing import Route
from server.runtime import Runtime
from server.session import Session, TurnHandle, utc_now
from server.store import StoredSession
from server.turn import Turn
from server.versions import Replaces
from server.views import history_frame, history_page_frame, image_urls, session_frame

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New chat"
MODEL_COMMAND = "/model"
MAX_CACHED_SESSIONS = 128  # with FRAME_LOG_BYTES, bounds the frame logs to about 256 MiB
UNSAVED_RETRY_SECONDS = 1.0  # how often a reply the store refused is tried again


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]


class SessionHub:
    def __init__(self, rt: Runtime, live: RedisLive | None = None) -> None:
        self.rt = rt
        self.live = live
        self.sessions: dict[str, Session] = {}
        self.live_turns = LiveTurns(live, self.sessions, self.spawn) if live is not None else None
        self.compaction = compaction_for(rt.options)
        self.coalesce_seconds = rt.settings.server.coalesce_ms / 1000
        self._pending_restore: set[str] = set()
        self._lock = anyio.Lock()
        self.connections = 0
        self._retrying: set[str] = set()  # sessions whose refused replies are being retried

    # --- the connection cap -------------------------------------------------------------------

    def admit(self) -> bool:
        """Count one more open socket, or refuse it at ``server.max_connections``."""
        if self.connections >= self.rt.settings.server.max_connections:
            return False
        self.connections += 1
        return True

    def release(self) -> None:
        self.connections -= 1

    # --- finding, creating, caching -----------------------------------------------------------

    async def open(self, session_id: str | None) -> Session:
        async with self._lock:
            session = self.sessions.pop(session_id, None) if session_id else None
            if session is not None:
                self.sessions[session.id] = session
                session = await self.current(session)
            if session is None and session_id:
                session = await self._load(session_id)
            if session is None:
                session = await self._create()
            self.sessions[session.id] = session  # most recently opened last
            self._evict_idle()
            return session

    def _evict_idle(self) -> None:
        """Keep the cache bounded: the store holds every session, memory only the recent ones. An
        evicted session's frame log goes with it; a client resuming it gets a fresh snapshot."""
        excess = len(self.sessions) - MAX_CACHED_SESSIONS
        for session_id, session in list(self.sessions.items()):
            if excess <= 0:
                return
            if (not session.channel.watched and session.turn is None and not session.unsaved
                    and not session.notices.unsaved):
                del self.sessions[session_id]
                self._pending_restore.discard(session_id)
                excess -= 1

    def _session(self, session_id: str, title: str, route: Route, transcript: list[ChatMessage],
                 first_seq: int = 0, stored: StoredSession | None = None,
                 channel: FrameChannel | None = None) -> Session:
        if channel is None:
            channel = self.live.channel(session_id) if self.live else FrameChannel(session_id, self.rt.bus,
                                                                                    first_seq)
        return Session(session_id, title, route, transcript, channel=channel, store=self.rt.store,
                       meter=self.rt.meter, image_token_cost=self.rt.options.image_token_cost,
                       calls=stored.calls if stored else None, trims=stored.trims if stored else None,
                       notices=stored.notices if stored else None)

    async def _create(self) -> Session:
        route = self.rt.resolver.default_route()
        session = self._session(new_session_id(), DEFAULT_TITLE, route, [])
        session.stored = False  # stored with its first message: an opened page leaves no empty session
        if self.rt.options.system_prompt:
            session.add(ChatMessage("system", self.rt.options.system_prompt, created_at=utc_now()))
        if self.live is not None:
            # Several instances: another one can only open the session from the store, so an empty
            # session is stored at once (the price of a load balancer: an opened page leaves a row).
            await self._store_new(session)
        return session

    async def _store_new(self, session: Session) -> None:
        if session.stored:
            return
        await self.rt.store.create_session(session.id, title=session.title, route=session.route.name)
        session.stored = True
        if session.transcript:
            await self.rt.store.append_messages(session.id, list(session.transcript))
        await session.save_notices()  # a /model answered before the first message

    def _stored_route(self, name: str) -> Route:
        default = self.rt.resolver.default_route()
        if not name or name == default.name:
            return default
        try:
            return self.rt.resolver.parse(name, kind="switch")
        except UnknownRoute:
            log.warning("stored route %s is no longer configured; using %s", name, default.name)
            return default

    async def _load(self, session_id: str, channel: FrameChannel | None = None) -> Session | None:
        stored = await self.rt.store.get_session(session_id)
        if stored is None:
            return None
        # A reloaded session numbers its frames from now (in microseconds), above anything an earlier
        # incarnation sent, so a client's old last_seq can never be mistaken for one of these.
        session = self._session(stored.id, stored.title, self._stored_route(stored.route), stored.messages,
                                first_seq=time.time_ns() // 1000, stored=stored, channel=channel)
        # A tool call whose result is missing may be one another instance is running right now.
        if self.live is None or await self.live.lease.holder(session_id) is None:
            await session.set_aside_orphans()
        self._pending_restore.add(session.id)
        return session

    async def messages_of(self, session_id: str) -> list[ChatMessage]:
        """A session's transcript: the open copy when cached, else the store's (an image URL)."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session.transcript
        stored = await self.rt.store.get_session(session_id)
        if stored is None:
            raise UnknownSession(f"no session {echo(session_id)}")
        return stored.messages

    # --- clients joining and leaving ----------------------------------------------------------

    async def attach(self, outbox: Outbox, session_id: str | None, last_seq: int | None) -> Session:
        """Open the session and put its first frames in ``outbox``: the ``session`` frame, then
        the frames missed since ``last_seq`` or a ``history`` snapshot."""
        session = await self.open(session_id)
        resumed = session_id == session.id
        routes = self.rt.resolver.routes()
        page = self.rt.settings.server.history_page_messages
        replayed = await session.channel.join(
            outbox, last_seq if resumed else None,
            head=lambda seq: session_frame(session, resumed=resumed, seq=seq, routes=routes),
            snapshot=lambda: [history_frame(session, page)],
            turn=await self.live_turns.remote_turn(session, page) if self.live_turns else None)
        if not replayed:
            # In the background: a window discovery on a slow provider must not hold the reader.
            self.spawn(self.after_hello, session)
        return session

    def detach(self, session: Session, outbox: Outbox) -> None:
        """A client left; with nobody watching, the turn stops unless ``server.keep_generating``."""
        session = self.sessions.get(session.id, session)
        if session.channel.detach(outbox):
            if not self.rt.settings.server.keep_generating:
                self.stop(session, remote=False)
            self._forget_idle(session)

    async def after_hello(self, session: Session) -> None:
        """Announce the restore trim (once) and send the meter for the session's route."""
        if session.id in self._pending_restore:
            self._pending_restore.discard(session.id)
            report = session.ledger.trim_turn_count(self.rt.options.turn_limit)
            if await session.trim(report):
                await session.emit_meter(session.route, "restore")
                return
        await session.emit_meter(session.route, "hello")

    async def drain(self, grace: float) -> None:
        """The server is shutting down: end every ``/events`` stream, stop every turn and wait (at
        most ``grace`` seconds) until each has written its reply, marked interrupted."""
        self.rt.bus.close()
        handles = [session.turn for session in self.sessions.values() if session.turn is not None]
        for session in self.sessions.values():
            self.stop(session, remote=False)  # only the turns this instance runs
        with anyio.move_on_after(grace):
            for handle in handles:
                await handle.done.wait()
            for session in self.sessions.values():
                await self._last_try(session)

    async def _last_try(self, session: Session) -> None:
        if not session.unsaved:
            return
        try:
            await session.save_reply()
        except StoreUnavailable:
            log.error("session %s: %d reply(s) not written, the store still refuses writes at shutdown",
                      session.id, len(session.unsaved))

    def deleted(self, session_id: str) -> None:
        """The session was deleted through the API: stop its turn and tell its open tabs."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.stop(session)
        channel = session.channel if session else self._shared_channel(session_id)
        if channel is not None:
            channel.emit(error_frame(UnknownSession("this session was deleted; start a new chat")))
        if session is None and self.live_turns is not None:
            self.spawn(self.live_turns.stop_remote, session_id)

    async def renamed(self, session_id: str) -> None:
        """The session was renamed through the API: its open tabs (on any instance) show the new title."""
        session = self.sessions.get(session_id)
        channel = session.channel if session else self._shared_channel(session_id)
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
        session = await self.current(session)
        route = self.rt.resolver.parse(route_text.strip(), kind="switch")
        session.route = route
        if session.stored:  # a session not yet stored takes its route along when it is
            await self.rt.store.set_route(session.id, route.name)
        await session.emit_meter(route, "switch")  # the page confirms the switch from this frame
        await session.save_notices()  # the confirmation comes back on a reload

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
        session = self.sessions.get(session.id, session)
        if session.turn is not None:
            session.turn.cancel_scope.cancel()
        elif remote and self.live_turns is not None:
            self.spawn(self.live_turns.stop_remote, session.id)

    async def submit(self, session: Session, message_id: str, content: str,
                     payloads: list[ImagePayload], retry_of: str | None = None,
                     edit_of: str | None = None) -> None:
        session = await self.current(session)
        if message_id in session.client_ids:
            return  # a client resending after a reconnect: the message is already durable
        if content.strip().split(" ", 1)[0] == MODEL_COMMAND:
            await self.model_command(session, content.strip()[len(MODEL_COMMAND):])
            return
        if session.busy:
            raise Busy("a reply is still being written in this session; stop it or wait for it to finish")
        if session.knows(message_id):
            raise BadFrame(f"message.id {message_id!r} is already used by another message in this session")
        if session.unsaved:
            await session.save_reply()  # the earlier reply first, or StoreUnavailable and nothing stored
        replaces = Replaces.of(session, retry_of, edit_of)
        images = decode_images(payloads, self.rt.options.max_image_bytes)
        turn_id = uuid.uuid4().hex[:12]
        # Claim the session before the first await: two tabs sending at once start one turn.
        handle = session.turn = TurnHandle(turn_id, anyio.CancelScope())
        claim: Claim | None = None
        try:
            claim = await self.live_turns.claim(session, turn_id) if self.live_turns else None
            route, text = await self._accept(session, message_id, content, images, turn_id, replaces)
        except BaseException:
            session.turn = None
            if claim is not None and self.live_turns is not None:
                with anyio.CancelScope(shield=True):
                    await self.live_turns.release(session, claim)
            raise
        await self._maybe_title(session, text)
        turn = Turn(self.rt, session, turn_id, route, self.compaction)
        if claim is not None and self.live_turns is not None:
            self.spawn(self.live_turns.heartbeat, session, handle, claim)
        self.spawn(self._run_turn, session, turn, handle, claim)

    async def _accept(self, session: Session, message_id: str, content: str, images: list[Image],
                      turn_id: str, replaces: Replaces | None) -> tuple[Route, str]:
        """Store the user's message (durable before any provider call) and announce it."""
        route, text = self.rt.resolver.for_message(session.route, content)
        if replaces is not None:
            await replaces.set_aside(session, text)
        user = ChatMessage("user", text, images=images or None, turn_id=turn_id, id=message_id,
                           created_at=utc_now(), replaces=replaces.turn_id if replaces else None)
        await self._store_new(session)
        await self.rt.store.append_messages(session.id, [user])
        session.add(user)
        session.client_ids.add(message_id)
        session.emit(server_frame(
            "accepted", id=message_id, turn_id=turn_id, content=text, images=len(images) or None,
            created_at=user.created_at, image_urls=image_urls(session.id, user),
            **(replaces.echo() if replaces else {})))
        return route, text

    async def preview_edit(self, session: Session, turn_id: object) -> Frame:
        """The meter as it would read with ``turn_id`` and every later turn set aside (an edit of
        that turn's message), for the asking client only: nothing changes."""
        turns = session.turns_from(Replaces.checked("preview_edit.turn_id", turn_id))
        if not turns:
            raise BadFrame(f"preview_edit.turn_id: no turn {echo(turn_id)} in this session")
        meter = self.rt.meter
        reading = await meter.read(session.route, session.estimate_without(turns), meter.tools(session.route),
                                   session.anchors.get(session.route.name))  # the meter's own accounting
        frame = meter.frame(reading, session.ledger, EDIT_PREVIEW)
        frame.pop("trim_preview", None)  # the ledger's preview is of the history before the edit
        return frame

    async def _maybe_title(self, session: Session, text: str) -> None:
        if session.title != DEFAULT_TITLE or not text.strip():
            return
        title = " ".join(text.split())[:60]
        session.title = title
        await self.rt.store.rename_session(session.id, title)
        session.emit(server_frame("title", title=title))

    async def _run_turn(self, session: Session, turn: Turn, handle: TurnHandle, claim: Claim | None) -> None:
        try:
            if turn.route != session.route:
                await turn.emit_meter("hint")
            with handle.cancel_scope:
                await turn.run()
            if handle.cancel_scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._abort(session, turn)
        finally:
            session.turn = None
            handle.done.set()
            if claim is not None and self.live_turns is not None:
                with anyio.CancelScope(shield=True):
                    await self.live_turns.release(session, claim)
            with anyio.CancelScope(shield=True):
                await session.save_notices()  # the turn's errors and notices, for a reload
            if (session.unsaved or session.notices.unsaved) and session.id not in self._retrying:
                self._retrying.add(session.id)
                self.spawn(self._write_unsaved, session)
        if turn.route != session.route:
            await session.emit_meter(session.route, "done")

    async def _abort(self, session: Session, turn: Turn) -> None:
        try:
            await turn.finish_reply(interrupted=True)
        except StoreUnavailable:
            pass  # kept in session.unsaved; _write_unsaved writes it
        session.emit(server_frame("aborted", turn_id=turn.turn_id))

    async def _write_unsaved(self, session: Session) -> None:
        """Try the replies (and notices) the store refused again until it takes them, then say so.
        A newer turn writes them first too, so whichever succeeds first empties ``unsaved``."""
        try:
            while session.unsaved or session.notices.unsaved:
                await anyio.sleep(UNSAVED_RETRY_SECONDS)
                if session.unsaved:
                    try:
                        await session.save_reply()
                    except StoreUnavailable:
                        continue
                    session.emit(server_frame("notice", code="store_recovered", message=(
                        "the session store is writable again: the reply it refused is now saved")))
                await session.save_notices()  # the turn's error line, refused with the reply
        finally:
            self._retrying.discard(session.id)

    # --- several instances (live mode) --------------------------------------------------------

    async def current(self, session: Session) -> Session:
        """The cached session, reloaded from the store when another instance changed it (its
        frames came through the shared stream) and no turn runs on it here."""
        cached = self.sessions.get(session.id, session)
        channel = cached.channel
        if (not isinstance(channel, RedisChannel) or not channel.stale or cached.turn or cached.unsaved
                or cached.notices.unsaved):
            return cached
        channel.stale = False
        fresh = await self._load(cached.id, channel=channel)
        if fresh is None:
            return cached
        self.sessions[fresh.id] = fresh
        return fresh

    def _forget_idle(self, session: Session) -> None:
        if self.live_turns is not None:
            self.live_turns.forget_idle(session)

    def _shared_channel(self, session_id: str) -> FrameChannel | None:
        return self.live.channel(session_id) if self.live is not None else None
