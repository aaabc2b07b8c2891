"""The instance's connection to the live side shared by several instances (``[live] url``).

Per session, three keys and a pub/sub channel (``lease.py`` adds two keys for turns):

    meterchat:s:<id>:seq      the seq counter (INCR); born at the clock in microseconds, so a counter
                              lost with Redis restarts above every seq a client may still hold
    meterchat:s:<id>:frames   the frames, a stream capped with MAXLEN ~ ``stream_max_frames``; entry id
                              ``<seq>-0``, fields ``f`` (the frame as JSON, without seq), ``o`` (instance)
    meterchat:s:<id>:live     pub/sub: ``<seq>|<instance>|<frame JSON>`` for each frame, as appended

``RedisLive`` makes each session's ``RedisChannel`` (live_channel.py) and runs, per instance, the
appender that writes frames (live_append.py), the listener and a watchdog. Frames of other instances
reach local clients from the session's live channel, which every instance with a local client of the
session subscribes to: pushes, so watching costs no round trip per frame. Seqs are dense, so a gap
shows what pub/sub dropped, and the stream fills it (also right after subscribing). The same pub/sub
connection feeds the observer bus (``/events`` on every instance) and the instance's control channel
(``stop`` from another instance). The watchdog looks for turns whose instance died
(``lease.TurnLease.orphaned``). When Redis goes away, every watched channel is ``lost``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from server.config.settings import LiveSettings
from server.live.append import EVENTS_CHANNEL, Appender
from server.live.channel import RedisChannel
from server.live.lease import PREFIX, Claim, LiveUnavailable, TurnLease, session_key
from server.live.shared import SharedCalibrations, SharedWindows
from server.routing.resolver import RouteResolver
from server.sessions.channel import Frame
from server.sessions.events import EventBus

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.5
POOL_SIZE, POOL_WAIT_SECONDS = 100, 5.0  # connections per instance; a call's wait for a free one


def control_channel(instance: str) -> str:
    return f"{PREFIX}control:{instance}"


class RedisLive:
    """The instance's connection to the shared live side: appender, listener and watchdog."""

    def __init__(self, settings: LiveSettings, bus: EventBus, instance: str | None = None) -> None:
        # Calls beyond the pool wait for a connection: redis-py's default pool raised "Too many
        # connections", so under load a failed heartbeat had a live turn taken over (instance_lost).
        self.redis = Redis.from_pool(BlockingConnectionPool.from_url(
            settings.url, decode_responses=True, retry=Retry(NoBackoff(), 1), health_check_interval=30,
            max_connections=POOL_SIZE, timeout=POOL_WAIT_SECONDS))
        self.instance = instance or uuid.uuid4().hex[:12]
        self.bus = bus
        self.appender = Appender(self.redis, self.instance, settings.stream_max_frames,
                                 settings.coalesce_ms, settings.coalesce_bytes)
        self.lease = TurnLease(self.redis, self.instance, settings.lease_ttl_ms)
        self.on_control: Callable[[dict[str, Any]], None] = lambda message: None
        self.on_orphan: Callable[[str, Claim], None] = lambda session_id, claim: None
        self.watched: dict[str, RedisChannel] = {}
        self._pubsub: PubSub | None = None
        self._tasks: TaskGroup | None = None

    def channel(self, session_id: str) -> RedisChannel:
        return self.watched.get(session_id) or RedisChannel(session_id, self)

    # --- running --------------------------------------------------------------------------------

    async def start(self, tasks: TaskGroup, resolver: RouteResolver | None = None) -> None:
        """Load the append script and run the loops; with ``resolver``, its calibration is shared."""
        try:
            await self.appender.load()
            if resolver is not None:
                shared = SharedCalibrations(self.redis, tasks, self.instance)
                await shared.load()
                resolver.calibration = shared
                shared.on_window = resolver.adopt_window
                resolver.remember_windows(SharedWindows(resolver.window_memory, self.redis, self.instance))
                tasks.start_soon(shared.listen)
        except RedisError as exc:
            raise LiveUnavailable(f"live.url: cannot reach Redis ({exc})") from exc
        self._tasks = tasks
        for loop in (self.appender.run, self._listen_loop, self._watchdog_loop):
            tasks.start_soon(loop)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> None:
        try:
            await self.redis.ping()
        except RedisError as exc:
            raise LiveUnavailable(f"cannot reach Redis ({exc})") from exc

    # --- channels -------------------------------------------------------------------------------

    def enqueue(self, channel: RedisChannel, frame: Frame) -> None:
        self.appender.enqueue(channel, frame)

    def watch(self, channel: RedisChannel) -> None:
        """A local client joined: subscribe to the session's live channel (the listener catches
        up from the stream once Redis confirms, so nothing published in between is missed)."""
        self.watched[channel.session_id] = channel
        self._subscription("subscribe", channel.session_id)

    def unwatch(self, channel: RedisChannel) -> None:
        if self.watched.get(channel.session_id) is channel:
            del self.watched[channel.session_id]
            self._subscription("unsubscribe", channel.session_id)

    def _subscription(self, command: str, session_id: str) -> None:
        pubsub, tasks = self._pubsub, self._tasks
        if pubsub is None or tasks is None:
            return  # the listener subscribes to every watched session when it (re)connects

        async def send() -> None:
            try:
                await pubsub.execute_command(command.upper(), session_key(session_id, "live"))
            except RedisError as exc:  # the listener sees the same failure and reconnects
                log.warning("live: %s %s failed: %s", command, session_id, exc)

        tasks.start_soon(send)

    # --- frames in ------------------------------------------------------------------------------

    async def read_after(self, session_id: str, last_seq: int) -> tuple[list[Frame], int] | None:
        """The frames after ``last_seq`` and the seq they reach, or None when the stream cannot
        replay from there (trimmed past it, or a number this stream never gave)."""
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.get(session_key(session_id, "seq"))
                pipe.xrange(session_key(session_id, "frames"), "-", "+", count=1)
                pipe.xrange(session_key(session_id, "frames"), f"({last_seq}-0", "+")
                counter, first, entries = await pipe.execute()
        except RedisError as exc:
            raise LiveUnavailable(f"the live stream is unavailable ({exc})") from exc
        end = int(counter or 0)
        if last_seq > end or (last_seq < end and (not first or stream_seq(first[0][0]) > last_seq + 1)):
            return None
        return [{**json.loads(fields["f"]), "seq": stream_seq(entry_id)} for entry_id, fields in entries], end

    async def head_seq(self, session_id: str) -> int:
        try:
            return int(await self.redis.get(session_key(session_id, "seq")) or 0)
        except RedisError as exc:
            raise LiveUnavailable(f"the live stream is unavailable ({exc})") from exc

    async def _listen_loop(self) -> None:
        """One pub/sub connection: observer events, this instance's control channel and the live
        channel of every session a local client watches. Pushes cost no request: a watching
        instance pays no round trip per frame."""
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    first = list(self.watched)
                    await pubsub.subscribe(EVENTS_CHANNEL, control_channel(self.instance),
                                           *(session_key(sid, "live") for sid in first))
                    self._pubsub = pubsub  # from now on watch() subscribes by itself
                    late = [session_key(sid, "live") for sid in self.watched if sid not in first]
                    if late:  # watched while the first subscription was on its way
                        await pubsub.subscribe(*late)
                    async for message in pubsub.listen():
                        await self._heard(message)
            except RedisError as exc:
                self._pubsub = None
                log.warning("live: lost Redis: %s", exc)
                for channel in list(self.watched.values()):
                    channel.lost(exc)
                await anyio.sleep(RETRY_SECONDS)

    async def _heard(self, message: dict[str, Any]) -> None:
        name, kind = message.get("channel", ""), message.get("type")
        if name.endswith(":live"):
            channel = self.watched.get(name[len(PREFIX) + 2:-len(":live")])
            if channel is not None and kind == "subscribe":
                await self._catch_up(channel)
            elif channel is not None and kind == "message":
                seq, origin, body = message["data"].split("|", 2)
                if int(seq) > channel.seq + 1:  # a gap: what pub/sub dropped is in the stream
                    await self._catch_up(channel)
                channel.arrived(int(seq), origin, body)
        elif kind == "message" and name == EVENTS_CHANNEL:
            data = json.loads(message["data"])
            event = data["event"]
            self.bus.publish(event["session_id"], {**event["frame"], "seq": data["seq"]})
        elif kind == "message":
            self.on_control(json.loads(message["data"]))

    async def _catch_up(self, channel: RedisChannel) -> None:
        entries: list[Any] = await self.redis.xrange(session_key(channel.session_id, "frames"),
                                                     f"({channel.seq}-0", "+") or []
        for entry_id, fields in entries:
            channel.arrived(stream_seq(entry_id), fields.get("o", ""), fields["f"])

    async def send_control(self, instance: str, message: dict[str, Any]) -> None:
        try:
            await self.redis.publish(control_channel(instance), json.dumps(message))
        except RedisError as exc:
            raise LiveUnavailable(f"the live side is unavailable ({exc})") from exc

    async def _watchdog_loop(self) -> None:
        while True:
            await anyio.sleep(self.lease.ttl_ms / 2000)
            try:
                orphans = await self.lease.orphaned(list(self.watched))
            except LiveUnavailable:
                continue  # the tail reports Redis being away
            for session_id, claim in orphans:
                self.on_orphan(session_id, claim)


def stream_seq(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])
