"""The cache of open sessions: finds a session, creates one, or loads it from the store.

The store holds every session; memory holds the recently opened ones, at most
``MAX_CACHED_SESSIONS`` beyond those in use (watched, running a turn, or holding what the store
refused). A session loaded from the store is restored (restore.py). Its channel comes from the
hub's ``Instances`` (a ``RedisChannel`` in live mode), and a cached session another instance
changed (its channel went ``stale``) is read from the store again before it is used here.
"""

from __future__ import annotations

import time
import uuid

from server.errors import UnknownSession
from server.history.messages import ChatMessage
from server.locks import KeyedLock
from server.protocol import echo
from server.routing.resolver import Route
from server.sessions.channel import FrameChannel
from server.sessions.instances import Instances
from server.sessions.restore import Restores
from server.sessions.runtime import Runtime
from server.sessions.session import Session, utc_now
from server.store.base import StoredSession

DEFAULT_TITLE = "New chat"
MAX_CACHED_SESSIONS = 128  # with FRAME_LOG_BYTES, bounds the frame logs to about 256 MiB


def visible(session_owner: str | None, owner: str | None) -> bool:
    """Whether a caller speaking for ``owner`` (None: nobody signs in, everything is visible) may
    open a session owned by ``session_owner``."""
    return owner is None or session_owner == owner


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]


class SessionCache:
    def __init__(self, rt: Runtime, instances: Instances) -> None:
        self.rt = rt
        self.instances = instances
        self.sessions: dict[str, Session] = {}
        self.restores = Restores(rt, instances)
        # One open of a given id at a time (a second one finds it cached); other ids, and new
        # sessions, never wait for it: a slow store read of one session holds up no one else.
        self._opening = KeyedLock()

    async def open(self, session_id: str | None, owner: str | None = None) -> Session:
        """The session ``session_id`` names (cached, or from the store), or a new one. With an
        ``owner`` (accounts), a session owned by anyone else is one that does not exist: the caller
        gets a new session of their own, exactly as for an unknown id."""
        session = None
        if session_id:
            async with self._opening.hold(session_id):
                session = await self._existing(session_id, owner)
        if session is None:
            session = await self._create(owner)  # a new id: nobody else can be opening it
        self.sessions[session.id] = session  # most recently opened last
        self._evict_idle()
        return session

    async def _existing(self, session_id: str, owner: str | None) -> Session | None:
        session = self.sessions.get(session_id)
        if session is None:
            return await self._load(session_id, owner=owner)
        if not visible(session.owner, owner):
            return None
        self.sessions[session.id] = self.sessions.pop(session.id)  # most recently opened last
        return await self.current(session)

    def _evict_idle(self) -> None:
        """Keep the cache bounded: the store holds every session, memory only the recent ones. An
        evicted session's frame log goes with it; a client resuming it gets a fresh snapshot."""
        excess = len(self.sessions) - MAX_CACHED_SESSIONS
        if excess <= 0:
            return  # before the copy below: an open under the bound walks nothing
        for session_id, session in list(self.sessions.items()):
            if excess <= 0:
                return
            if (not session.channel.watched and session.turn is None and not session.has_unsaved
                    and not session.notices.unsaved):
                del self.sessions[session_id]
                self.restores.forget(session_id)
                excess -= 1

    def cached(self, session: Session) -> Session:
        """The cache's copy of ``session`` (a client may still hold one the cache has replaced)."""
        return self.sessions.get(session.id, session)

    async def current(self, session: Session) -> Session:
        """The cached session, reloaded from the store when another instance changed it (its
        frames came through the shared stream) and no turn runs on it here."""
        cached = self.cached(session)
        channel = cached.channel
        if not channel.stale or cached.turn or cached.has_unsaved or cached.notices.unsaved:
            return cached
        channel.stale = False
        fresh = await self._load(cached.id, channel=channel)
        if fresh is None:
            return cached
        self.sessions[fresh.id] = fresh
        return fresh

    def shared_channel(self, session_id: str) -> FrameChannel | None:
        """The channel of a session not cached here, when other instances may have it open."""
        return self.instances.shared_channel(session_id)

    async def messages_of(self, session_id: str, owner: str | None = None) -> list[ChatMessage]:
        """A session's transcript: the open copy when cached, else the store's (an image URL);
        ``UnknownSession`` for one ``owner`` may not see."""
        session = self.sessions.get(session_id)
        if session is not None and visible(session.owner, owner):
            return session.transcript
        stored = await self.rt.store.get_session(session_id) if session is None else None
        if stored is None or not visible(stored.owner, owner):
            raise UnknownSession(f"no session {echo(session_id)}")
        return stored.messages

    async def store_new(self, session: Session) -> None:
        """Store a session created here, with what it holds so far (a no-op once stored)."""
        if session.stored:
            return
        await self.rt.store.create_session(session.id, title=session.title, route=session.route.name,
                                           owner=session.owner)
        session.stored = True
        if session.transcript:
            await self.rt.store.append_messages(session.id, list(session.transcript))
        await session.save_notices()  # a /model answered before the first message

    def _new(self, session_id: str, title: str, route: Route, transcript: list[ChatMessage],
             first_seq: int = 0, stored: StoredSession | None = None,
             channel: FrameChannel | None = None, owner: str | None = None) -> Session:
        if channel is None:
            channel = self.instances.channel(session_id, first_seq)
        session = Session(session_id, title, route, transcript, channel=channel, store=self.rt.store,
                          meter=self.rt.meter, image_token_cost=self.rt.options.image_token_cost,
                          calls=stored.calls if stored else None, trims=stored.trims if stored else None,
                          notices=stored.notices if stored else None, metrics=self.rt.metrics,
                          tasks=self.rt.task_group)
        session.owner = stored.owner if stored else owner
        return session

    async def _create(self, owner: str | None) -> Session:
        route = self.rt.resolver.default_route()
        session = self._new(new_session_id(), DEFAULT_TITLE, route, [], owner=owner)
        session.stored = False  # stored with its first message: an opened page leaves no empty session
        if self.rt.options.system_prompt:
            session.add(ChatMessage("system", self.rt.options.system_prompt, created_at=utc_now()))
        if self.instances.store_at_once:
            # Several instances: another one can only open the session from the store, so an empty
            # session is stored at once (the price of a load balancer: an opened page leaves a row).
            await self.store_new(session)
        return session

    async def _load(self, session_id: str, channel: FrameChannel | None = None,
                    owner: str | None = None) -> Session | None:
        stored = await self.rt.store.get_session(session_id)
        if stored is None or not visible(stored.owner, owner):
            return None
        # A reloaded session numbers its frames from now (in microseconds), above anything an earlier
        # incarnation sent, so a client's old last_seq can never be mistaken for one of these.
        session = self._new(stored.id, stored.title, self.restores.route(stored.route), stored.messages,
                            first_seq=time.time_ns() // 1000, stored=stored, channel=channel)
        await self.restores.restored(session)
        return session
