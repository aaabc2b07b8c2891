"""Frames out to Redis: the append script and the one flusher per instance that runs it.

``RedisChannel.emit`` queues a frame here; ``Appender.run`` sends every queued frame in one
pipelined round trip of the append script (INCR + XADD + PUBLISH, see live_redis.py for the keys),
so a streaming turn never waits on Redis and a busy instance pays well under one round trip per
chunk. Before that, a session's chunk frames of one turn queued together are joined (``join_chunks``:
one frame, one seq, one stream entry and one publish for the run, up to ``coalesce_bytes`` of text;
``coalesce_ms`` waits that long first so that more join), as ``web/connection.py`` joins what it
writes to a socket. Each channel then learns its frames' seqs (``RedisChannel.assigned``, with how
many emitted frames a joined one stands for); a batch Redis refused makes its channels ``lost``.
"""

from __future__ import annotations

import json
import logging

import anyio
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from server.live.channel import RedisChannel
from server.live.lease import PREFIX, session_key
from server.sessions.channel import Frame
from server.sessions.events import OBSERVED_TYPES

log = logging.getLogger(__name__)

EVENTS_CHANNEL = PREFIX + "events"  # observed frames of every session, for /events on every instance
STREAM_TTL_MS = 24 * 3600 * 1000  # an idle session's stream and counter leave Redis after a day

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


class Joined:
    """One frame bound for Redis, and how many emitted frames it stands for."""

    __slots__ = ("channel", "frame", "parts", "count", "size")

    def __init__(self, channel: RedisChannel, frame: Frame) -> None:
        self.channel, self.frame, self.count = channel, frame, 1
        self.size = len(frame.get("content") or "")
        self.parts: list[str] | None = None  # the contents of a joined run, joined once at the end

    def take(self, frame: Frame, limit: int) -> bool:
        """Join ``frame`` (a chunk of the same turn) if the text stays within ``limit``."""
        last = self.frame
        if frame.get("type") != "chunk" or last.get("type") != "chunk" \
                or frame.get("turn_id") != last.get("turn_id"):
            return False
        if self.size + len(frame["content"]) > limit:
            return False
        parts = self.parts if self.parts is not None else [last["content"]]
        parts.append(frame["content"])
        self.parts, self.count, self.size = parts, self.count + 1, self.size + len(frame["content"])
        return True

    def done(self) -> Frame:
        if self.parts is not None:
            self.frame = {**self.frame, "content": "".join(self.parts)}
            self.parts = None
        return self.frame


def join_chunks(batch: list[tuple[RedisChannel, Frame]], limit: int) -> list[Joined]:
    """``batch`` with each session's runs of chunk frames of one turn joined (order kept within a
    session; sessions are independent streams, so their frames need no order between them)."""
    out: list[Joined] = []
    last: dict[RedisChannel, Joined] = {}
    for channel, frame in batch:
        tail = last.get(channel)
        if tail is not None and tail.take(frame, limit):
            continue
        last[channel] = joined = Joined(channel, frame)
        out.append(joined)
    for joined in out:
        joined.done()
    return out


class Appender:
    """The instance's queue of frames bound for Redis and the loop that flushes it."""

    def __init__(self, redis: Redis, instance: str, max_frames: int, coalesce_ms: int = 0,
                 coalesce_bytes: int = 16384) -> None:
        self.redis = redis
        self.instance = instance
        self.max_frames = max_frames
        self.coalesce_seconds = coalesce_ms / 1000
        self.coalesce_bytes = coalesce_bytes
        self.round_trips = 0  # appends sent (one per flush); with frames_sent, the cost per frame
        self.frames_sent = 0
        self._queue: list[tuple[RedisChannel, Frame]] = []
        self._queued = anyio.Event()
        self._sha = ""

    async def load(self) -> None:
        """Load the append script (again after Redis restarted empty)."""
        self._sha = await self.redis.script_load(_APPEND)

    def enqueue(self, channel: RedisChannel, frame: Frame) -> None:
        self._queue.append((channel, frame))
        self._queued.set()

    async def run(self) -> None:
        while True:
            await self._queued.wait()
            if self.coalesce_seconds:
                await anyio.sleep(self.coalesce_seconds)
            self._queued = anyio.Event()
            batch, self._queue = self._queue, []
            joined = join_chunks(batch, self.coalesce_bytes)
            try:
                seqs = await self._append([(item.channel, item.frame) for item in joined])
            except RedisError as exc:
                log.warning("live: %d frames not sent: %s", len(batch), exc)
                for channel in {channel for channel, _ in batch}:
                    channel.lost(exc)
                seqs = [None] * len(joined)
            for item, seq in zip(joined, seqs, strict=True):
                item.channel.assigned(item.frame, seq, frames=item.count)

    async def _append(self, batch: list[tuple[RedisChannel, Frame]]) -> list[int | None]:
        for attempt in (1, 2):
            try:
                return await self._send(batch)
            except NoScriptError:  # Redis restarted empty: load the script again, once
                if attempt == 2:
                    raise
                await self.load()
        return []

    async def _send(self, batch: list[tuple[RedisChannel, Frame]]) -> list[int | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for channel, frame in batch:
                sid = channel.session_id
                event = json.dumps({"session_id": sid, "frame": frame}) if frame.get("type") in \
                    OBSERVED_TYPES else ""
                keys = [session_key(sid, part) for part in ("seq", "frames", "live")]
                body = json.dumps(frame, ensure_ascii=False)
                pipe.evalsha(self._sha, 3, *keys, self.max_frames, body, self.instance, STREAM_TTL_MS,
                             EVENTS_CHANNEL if event else "", event)
            replies = await pipe.execute()
        self.round_trips += 1
        self.frames_sent += len(batch)
        return [int(seq) for seq in replies[:len(batch)]]
