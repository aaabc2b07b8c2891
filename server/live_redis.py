"""The live side shared by several instances through Redis (``[live] url``).

Per session, three keys and a pub/sub channel (``lease.py`` adds two keys for turns):

    meterchat:s:<id>:seq      the seq counter (INCR); born at the clock in microseconds, so a counter
                              lost with Redis restarts above every seq a client may still hold
    meterchat:s:<id>:frames   the frames, a stream capped with MAXLEN ~ ``stream_max_frames``; entry id
                              ``<seq>-0``, fields ``f`` (the frame as JSON, without seq), ``o`` (instance)
    meterchat:s:<id>:live     pub/sub: ``<seq>|<instance>|<frame JSON>`` for each frame, as appended

``RedisChannel.emit`` queues the frame; one flusher per instance sends every queued frame in one
pipelined round trip (the append script: INCR + XADD + PUBLISH), so a streaming turn never waits on
Redis and a busy instance pays well under one round trip per chunk. Local clients get each frame
the moment its seq is known when nothing can be missing before it; otherwise (frames of other
instances) from the session's live channel, which every instance with a local client of the session
subscribes to: pushes, so watching costs no round trip per frame. Seqs are dense, so a gap shows
what pub/sub dropped, and the stream fills it (also right after subscribing). The same pub/sub
connection feeds the observer bus (``/events`` on every instance) and the instance's control
channel (``stop`` from another instance). A watchdog looks for turns whose instance died
(``lease.TurnLease.orphaned``).

When Redis goes away, local clients get a ``live_unavailable`` error and their sockets close, so they
reconnect and resume (or get the error again) instead of waiting on a stream that says nothing.
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
from redis.exceptions import NoScriptError, RedisError

from server.channel import Frame, FrameChannel, Outbox, Packet
from server.config import LiveSettings
from server.errors import error_frame
from server.events import OBSERVED_TYPES, EventBus
from server.lease import PREFIX, Claim, InstanceLost, LiveUnavailable, TurnLease, session_key
from server.live_shared import SharedCalibrations, SharedWindows
from server.routing import RouteResolver

__all__ = ["InstanceLost", "LiveUnavailable", "RedisChannel", "RedisLive"]

log = logging.getLogger(__name__)

EVENTS_CHANNEL = PREFIX + "events"
STREAM_TTL_MS = 24 * 3600 * 1000  # an idle session's stream and counter leave Redis after a day
RETRY_SECONDS = 0.5
POOL_SIZE, POOL_WAIT_SECONDS = 100, 5.0  # connections per instance; a call's wait for a free one

# The expiry is renewed on a session's first frame and every EXPIRY_EVERY frames after it, not on
# each: two PEXPIREs per frame were a third of the commands Redis ran (bench/load.py --instances),
# and a day's TTL does not care about the last few frames.
EXPIRY_EVERY = 64
_APPEND = """
local seq = redis.call('INCR', KEYS[1])
local fresh = seq == 1
if fresh then
  local now = redis.call('TIME')
  seq = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[1], string.format('%.0f', seq))
end
local id = string.format('%.0f', seq)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], id .. '-0', 'f', ARGV[2], 'o', ARGV[3])
if fresh or seq % """ + str(EXPIRY_EVERY) + """ == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
redis.call('PUBLISH', KEYS[3], id .. '|' .. ARGV[3] .. '|' .. ARGV[2])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], '{"seq": ' .. id .. ', "event": ' .. ARGV[6] .. '}') end
return seq
"""


def control_channel(instance: str) -> str:
    return f"{PREFIX}control:{instance}"


class RedisChannel(FrameChannel):
    """A session's frames through Redis: same ``emit``/``join``/``detach`` as ``FrameChannel``.

    ``seq`` is the last frame delivered to this instance's outboxes, in stream order; each outbox
    has a floor (the seq its first frames reached), below which later deliveries skip it.
    ``stale`` says another instance changed the session since it was loaded here.
    """

    def __init__(self, session_id: str, live: RedisLive) -> None:
        super().__init__(session_id, live.bus)
        self.live = live
        self.floors: dict[Outbox, int] = {}
        self.assigned_max = 0  # the highest seq given to a frame emitted here
        self.pending = 0  # frames emitted here still waiting for their seq
        self._settled = anyio.Event()
        self._settled.set()
        self.stale = False

    def emit(self, frame: Frame) -> Frame:
        if self.pending == 0:
            self._settled = anyio.Event()
        self.pending += 1
        self.live.enqueue(self, frame)
        return frame

    def assigned(self, frame: Frame, seq: int | None) -> None:
        """The flusher's answer: ``frame`` got ``seq`` (None: it never reached Redis)."""
        self.pending -= 1
        if self.pending == 0:
            self._settled.set()
        if seq is None:
            return
        frame["seq"] = seq
        self.assigned_max = max(self.assigned_max, seq)
        if not self.floors:
            self.seq = max(self.seq, seq)
        elif seq == self.seq + 1:  # nothing can be missing before it: no need to wait for the tail
            self.deliver(frame)

    def arrived(self, seq: int, origin: str, body: str) -> None:
        """A frame from the session's live channel or its stream, in seq order."""
        if seq <= self.seq:
            return
        if origin != self.live.instance:
            self.stale = True
        self.deliver({**json.loads(body), "seq": seq})

    def deliver(self, frame: Frame) -> None:
        self.seq = frame["seq"]
        packet = Packet.of(frame)  # serialized once for every local socket and the log
        self.log.append(self.seq, packet.text)
        for outbox, floor in self.floors.items():
            if self.seq > floor:
                outbox.push(packet)

    async def settle(self) -> None:
        """Wait until every frame emitted here has its seq (so memory and stream agree)."""
        while self.pending:
            await self._settled.wait()

    async def join(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
                   snapshot: Callable[[], list[Frame]],
                   turn: tuple[int, Callable[[], list[Frame]]] | None = None) -> bool:
        """Replay from Redis after ``last_seq``; else, for a turn running elsewhere, a snapshot
        without it and its frames from ``turn[0]``; else a snapshot. True when it was a replay."""
        if last_seq is not None:
            got = await self.live.read_after(self.session_id, last_seq)
            if got is not None and self._replay(outbox, got, [head(last_seq)]):
                return True
        if turn is not None:
            start, before = turn
            got = await self.live.read_after(self.session_id, start)
            if got is not None and self._replay(outbox, got, [head(start), *stamped(before(), start)]):
                return False
        end = await self.live.head_seq(self.session_id)
        await self.settle()
        floor = max(end, self.seq, self.assigned_max)
        self._add(outbox, [Packet.of(frame) for frame in (head(floor), *stamped(snapshot(), floor))], floor)
        return False

    def _replay(self, outbox: Outbox, got: tuple[list[Frame], int], first: list[Frame]) -> bool:
        frames, end = got
        packets = [Packet.of(frame) for frame in first + frames]
        if self.seq > end:  # delivered here while Redis was being read
            missing = self.log.after(end)
            if missing is None:
                return False
            packets, end = packets + missing, self.seq
        self._add(outbox, packets, end)
        return True

    def _add(self, outbox: Outbox, first: list[Packet], floor: int) -> None:
        for packet in first:
            outbox.push(packet)
        if not self.floors:
            self.seq = max(self.seq, floor)
            self.live.watch(self)
        self.floors[outbox] = floor

    def attach(self, outbox: Outbox, last_seq: int | None, *, head: Callable[[int], Frame],
               snapshot: Callable[[], list[Frame]]) -> bool:
        raise TypeError("a RedisChannel reads Redis to attach a client: use `await join(...)`")

    def detach(self, outbox: Outbox) -> bool:
        self.floors.pop(outbox, None)
        if not self.floors:
            self.live.unwatch(self)
        return not self.floors

    @property
    def watched(self) -> bool:
        return bool(self.floors)

    def lost(self, exc: BaseException) -> None:
        """Redis failed under this channel: tell its clients and close their sockets to resume."""
        body = {**error_frame(LiveUnavailable(f"the live stream is unavailable ({exc}); reconnecting")),
                "seq": self.seq}
        packet = Packet.of(body)
        for outbox in list(self.floors):
            outbox.push(packet)
            outbox.end("the live stream is unavailable; reconnect with last_seq")


def stamped(frames: list[Frame], seq: int) -> list[Frame]:
    return [{**frame, "seq": seq} for frame in frames]


class RedisLive:
    """The instance's connection to the shared live side: flusher, tail, pub/sub and watchdog."""

    def __init__(self, settings: LiveSettings, bus: EventBus, instance: str | None = None) -> None:
        # Calls beyond the pool wait for a connection: redis-py's default pool raised "Too many
        # connections", so under load a failed heartbeat had a live turn taken over (instance_lost).
        self.redis = Redis.from_pool(BlockingConnectionPool.from_url(
            settings.url, decode_responses=True, retry=Retry(NoBackoff(), 1), health_check_interval=30,
            max_connections=POOL_SIZE, timeout=POOL_WAIT_SECONDS))
        self.instance = instance or uuid.uuid4().hex[:12]
        self.bus = bus
        self.max_frames = settings.stream_max_frames
        self.lease = TurnLease(self.redis, self.instance, settings.lease_ttl_ms)
        self.on_control: Callable[[dict[str, Any]], None] = lambda message: None
        self.on_orphan: Callable[[str, Claim], None] = lambda session_id, claim: None
        self.watched: dict[str, RedisChannel] = {}
        self.round_trips = 0  # appends sent (one per flush); with frames_sent, the cost per frame
        self.frames_sent = 0
        self._queue: list[tuple[RedisChannel, Frame]] = []
        self._queued = anyio.Event()
        self._append_sha = ""
        self._pubsub: PubSub | None = None
        self._tasks: TaskGroup | None = None

    def channel(self, session_id: str) -> RedisChannel:
        return self.watched.get(session_id) or RedisChannel(session_id, self)

    # --- running --------------------------------------------------------------------------------

    async def start(self, tasks: TaskGroup, resolver: RouteResolver | None = None) -> None:
        """Load the append script and run the loops; with ``resolver``, its calibration is shared."""
        try:
            self._append_sha = await self.redis.script_load(_APPEND)
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
        for loop in (self._flush_loop, self._listen_loop, self._watchdog_loop):
            tasks.start_soon(loop)

    async def aclose(self) -> None:
        await self.redis.aclose()

    # --- frames out -----------------------------------------------------------------------------

    def enqueue(self, channel: RedisChannel, frame: Frame) -> None:
        self._queue.append((channel, frame))
        self._queued.set()

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

    async def _flush_loop(self) -> None:
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            batch, self._queue = self._queue, []
            try:
                seqs = await self._append(batch)
            except RedisError as exc:
                log.warning("live: %d frames not sent: %s", len(batch), exc)
                for channel in {channel for channel, _ in batch}:
                    channel.lost(exc)
                seqs = [None] * len(batch)
            for (channel, frame), seq in zip(batch, seqs, strict=True):
                channel.assigned(frame, seq)

    async def _append(self, batch: list[tuple[RedisChannel, Frame]]) -> list[int | None]:
        for attempt in (1, 2):
            try:
                return await self._send(batch)
            except NoScriptError:  # Redis restarted empty: load the script again, once
                if attempt == 2:
                    raise
                self._append_sha = await self.redis.script_load(_APPEND)
        return []

    async def _send(self, batch: list[tuple[RedisChannel, Frame]]) -> list[int | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for channel, frame in batch:
                sid = channel.session_id
                event = json.dumps({"session_id": sid, "frame": frame}) if frame.get("type") in \
                    OBSERVED_TYPES else ""
                keys = [session_key(sid, part) for part in ("seq", "frames", "live")]
                body = json.dumps(frame, ensure_ascii=False)
                pipe.evalsha(self._append_sha, 3, *keys, self.max_frames, body, self.instance, STREAM_TTL_MS,
                             EVENTS_CHANNEL if event else "", event)
            replies = await pipe.execute()
        self.round_trips += 1
        self.frames_sent += len(batch)
        return [int(seq) for seq in replies[:len(batch)]]

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
