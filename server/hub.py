"""The session hub: opens, restores and caches live sessions and carries out what clients ask.

Every client request that changes a session goes through here, validated before anything changes:
a message becomes a durable user message and a turn; ``/model <route>`` and ``switch_model`` change
the session's route (a turn in flight finishes on the route it started with); ``stop`` cancels the
turn from any connected client. A stored session is restored with the turn limit and the orphan
sweep applied, and the trim is announced to the first client that opens it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from server.errors import BadFrame, Busy, ImageRejected, UnknownRoute, UnknownSession, error_frame
from server.history import ChatMessage, Image
from server.history_trim import sweep_orphans
from server.live import LiveSession, TurnHandle, new_session_id
from server.protocol import PROTOCOL_VERSION, ImagePayload, server_frame
from server.routing import Route
from server.runtime import Runtime
from server.session import Turn, emit_meter, record_trim, set_aside_turn

log = logging.getLogger(__name__)

DEFAULT_TITLE = "New chat"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MODEL_COMMAND = "/model"
HISTORY_TOOL_CHARS = 8000
MAX_CACHED_SESSIONS = 128  # with FRAME_LOG_BYTES, bounds the frame logs to about 256 MiB


def display_text(message: ChatMessage) -> str:
    """A tool result as the ``history`` frame shows it: long outputs are clipped there (the store
    and the exports keep them whole), so reopening a long session stays quick."""
    text = message.content
    if message.role != "tool" or len(text) <= HISTORY_TOOL_CHARS:
        return text
    hidden = len(text) - HISTORY_TOOL_CHARS
    return f"{text[:HISTORY_TOOL_CHARS]}\n\n[... {hidden:,} more characters, in the session export ...]"


def message_view(message: ChatMessage) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": message.id, "role": message.role, "content": display_text(message),
        "trimmed": message.trimmed,
        "interrupted": message.interrupted, "summary": message.summary, "breadcrumb": message.breadcrumb,
    }
    if message.turn_id:
        view["turn_id"] = message.turn_id
    if message.excluded:
        view["excluded"] = message.excluded
    if message.tool_calls:
        view["tool_calls"] = [{"id": c.id, "name": c.name, "args": c.arguments} for c in message.tool_calls]
    if message.tool_call_id:
        view["tool_call_id"] = message.tool_call_id
    if message.name:
        view["name"] = message.name
    if message.images:
        view["images"] = len(message.images)
    return view


def decode_images(payloads: list[ImagePayload], limit: int, message_id: str) -> list[Image]:
    images = []
    for index, payload in enumerate(payloads):
        if payload.media_type not in IMAGE_TYPES:
            raise ImageRejected(f"image {index + 1}: {payload.media_type!r} is not supported; "
                                f"send one of {', '.join(IMAGE_TYPES)}")
        try:
            size = len(base64.b64decode(payload.data, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise ImageRejected(f"image {index + 1}: data is not valid base64") from exc
        if size > limit:
            raise ImageRejected(f"image {index + 1} is {size:,} bytes; the limit is {limit:,} bytes "
                                f"(runtime.max_image_bytes)")
        images.append(Image(payload.media_type, payload.data))
    return images


class SessionHub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sessions: dict[str, LiveSession] = {}
        self._pending_restore: set[str] = set()
        self._lock = anyio.Lock()

    # --- opening ------------------------------------------------------------------------------

    async def open(self, session_id: str | None) -> LiveSession:
        async with self._lock:
            live = self.sessions.pop(session_id, None) if session_id else None
            if live is None and session_id:
                live = await self._load(session_id)
            if live is None:
                live = await self._create()
            self.sessions[live.id] = live  # most recently opened last
            self._evict_idle()
            return live

    def _evict_idle(self) -> None:
        """Keep the cache bounded: the store holds every session, memory only the recent ones. An
        evicted session's frame log goes with it; a client resuming it gets a fresh snapshot."""
        excess = len(self.sessions) - MAX_CACHED_SESSIONS
        for session_id, live in list(self.sessions.items()):
            if excess <= 0:
                return
            if not live.outboxes and live.turn is None:
                del self.sessions[session_id]
                self._pending_restore.discard(session_id)
                excess -= 1

    async def _create(self) -> LiveSession:
        route = self.rt.resolver.default_route()
        live = LiveSession(new_session_id(), DEFAULT_TITLE, route, [], self.rt.bus,
                           self.rt.settings.runtime.image_token_cost)
        await self.rt.store.create_session(live.id, title=live.title, route=route.name)
        if self.rt.settings.runtime.system_prompt:
            system = ChatMessage("system", self.rt.settings.runtime.system_prompt)
            live.add(system)
            await self.rt.store.append_messages(live.id, [system])
        return live

    def _stored_route(self, name: str) -> Route:
        default = self.rt.resolver.default_route()
        if not name or name == default.name:
            return default
        try:
            return self.rt.resolver.parse(name, kind="switch")
        except UnknownRoute:
            log.warning("stored route %s is no longer configured; using %s", name, default.name)
            return default

    async def _load(self, session_id: str) -> LiveSession | None:
        stored = await self.rt.store.get_session(session_id)
        if stored is None:
            return None
        # A reloaded session numbers its frames from now (in microseconds), above anything an earlier
        # incarnation sent, so a client's old last_seq can never be mistaken for one of these.
        live = LiveSession(stored.id, stored.title, self._stored_route(stored.route), stored.messages,
                           self.rt.bus, self.rt.settings.runtime.image_token_cost,
                           first_seq=time.time_ns() // 1000)
        swept = {m.id for m in sweep_orphans(live.view())}
        orphans = [m for m in live.view() if m.id not in swept and not m.breadcrumb]
        for message in orphans:
            message.excluded = "orphaned tool message (its call or result is missing)"
        if orphans:
            live.rebuild()
            await self.rt.store.save_messages(live.id, orphans)
        self._pending_restore.add(live.id)
        return live

    async def after_hello(self, live: LiveSession) -> None:
        """Announce the restore trim (once) and send the meter for the session's route."""
        if live.id in self._pending_restore:
            self._pending_restore.discard(live.id)
            report = live.ledger.trim_turn_count(self.rt.settings.runtime.turn_limit)
            if await record_trim(self.rt, live, report):
                await self.emit_context(live, live.route, "restore")
                return
        await self.emit_context(live, live.route, "hello")

    def snapshot(self, live: LiveSession, resumed: bool, seq: int) -> dict[str, Any]:
        frame = server_frame("session", session_id=live.id, resumed=resumed,
                             message_count=len(live.transcript), route=live.route.name,
                             routes=self.rt.resolver.routes(), title=live.title, protocol=PROTOCOL_VERSION)
        return {**frame, "seq": seq}

    def history(self, live: LiveSession) -> dict[str, Any]:
        live.sync_streaming()
        messages = [message_view(m) for m in live.transcript]
        return {**server_frame("history", messages=messages), "seq": live.seq}

    async def emit_context(self, live: LiveSession, route: Route, reason: str) -> None:
        await emit_meter(self.rt, live, route, reason)

    def deleted(self, session_id: str) -> None:
        """The session was deleted through the API: stop its turn and tell its open tabs."""
        live = self.sessions.pop(session_id, None)
        if live is None:
            return
        if live.turn is not None:
            live.turn.cancel_scope.cancel()
        live.emit(error_frame(UnknownSession("this session was deleted; start a new chat")))

    async def renamed(self, session_id: str) -> None:
        """The session was renamed through the API: its open tabs show the new title."""
        live = self.sessions.get(session_id)
        summary = await self.rt.store.get_summary(session_id) if live else None
        if live is not None and summary is not None:
            live.title = summary.title
            live.emit(server_frame("title", title=summary.title))

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``fn`` in the app's task group; a failure is logged, never allowed to stop the server."""
        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

        self.rt.task_group.start_soon(guarded)

    # --- requests -----------------------------------------------------------------------------

    async def switch(self, live: LiveSession, route_text: str) -> None:
        route = self.rt.resolver.parse(route_text.strip(), kind="switch")
        live.route = route
        await self.rt.store.set_route(live.id, route.name)
        await self.emit_context(live, route, "switch")

    def stop(self, live: LiveSession) -> None:
        if live.turn is not None:
            live.turn.cancel_scope.cancel()

    async def submit(self, live: LiveSession, message_id: str, content: str,
                     payloads: list[ImagePayload], retry_of: str | None = None) -> None:
        if message_id in live.client_ids:
            return  # a client resending after a reconnect: the message is already durable
        if content.strip().split(" ", 1)[0] == MODEL_COMMAND:
            await self.switch(live, content.strip()[len(MODEL_COMMAND):])
            return
        if live.busy:
            raise Busy("a reply is still being written in this session; stop it or wait for it to finish")
        images = decode_images(payloads, self.rt.settings.runtime.max_image_bytes, message_id)
        turn_id = uuid.uuid4().hex[:12]
        # Claim the session before the first await: two tabs sending at once start one turn.
        handle = live.turn = TurnHandle(turn_id, anyio.CancelScope())
        try:
            route, text = await self._accept(live, message_id, content, images, turn_id, retry_of)
        except BaseException:
            live.turn = None
            raise
        await self._maybe_title(live, text)
        self.spawn(self._run_turn, live, Turn(self.rt, live, turn_id, route), handle)

    async def _accept(self, live: LiveSession, message_id: str, content: str, images: list[Image],
                      turn_id: str, retry_of: str | None) -> tuple[Route, str]:
        """Store the user's message (durable before any provider call) and announce it."""
        if retry_of:
            # A retry replaces the failed turn: it stays in the transcript, no longer sent.
            if not await set_aside_turn(self.rt, live, retry_of, "replaced by a retry"):
                raise BadFrame(f"message.retry_of: no turn {retry_of!r} still sent in this session")
        route, text = self.rt.resolver.for_message(live.route, content)
        user = ChatMessage("user", text, images=images or None, turn_id=turn_id, id=message_id)
        await self.rt.store.append_messages(live.id, [user])
        live.add(user)
        live.client_ids.add(message_id)
        live.emit(server_frame("accepted", id=message_id, turn_id=turn_id, content=text,
                               images=len(images) or None))
        return route, text

    async def _maybe_title(self, live: LiveSession, text: str) -> None:
        if live.title != DEFAULT_TITLE or not text.strip():
            return
        title = " ".join(text.split())[:60]
        live.title = title
        await self.rt.store.rename_session(live.id, title)
        live.emit(server_frame("title", title=title))

    async def _run_turn(self, live: LiveSession, turn: Turn, handle: TurnHandle) -> None:
        try:
            if turn.route != live.route:
                await turn.emit_context("hint")
            with handle.cancel_scope:
                await turn.run()
            if handle.cancel_scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await turn.finish_reply(interrupted=True)
                    live.emit(server_frame("aborted", turn_id=turn.turn_id))
        finally:
            live.turn = None
            handle.done.set()
        if turn.route != live.route:
            await self.emit_context(live, live.route, "done")
