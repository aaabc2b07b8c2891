"""``TurnLease``: one turn, one instance, through two Redis keys per session.

    meterchat:s:<id>:lease   the live claim: SET NX PX ttl, extended by a heartbeat while the turn
                             runs, removed by compare-and-delete when it ends (only by its holder)
    meterchat:s:<id>:turn    the marker of a turn begun and not yet ended; it outlives the lease

Both hold the same token, ``{"instance", "turn_id", "start"}`` as JSON, where ``start`` is the
session's last frame seq before the turn (a client joining mid-turn on another instance replays the
turn's frames from there). A marker whose lease is gone names a turn whose instance died: the first
instance to ``take_over`` it (atomically, so only one does) tells the clients and clears it.
Every change is one Lua script, so no two instances can interleave between a read and a write.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from server.errors import MeterchatError

PREFIX = "meterchat:"
MARKER_TTL_MS = 24 * 3600 * 1000  # a marker nobody watched is gone after a day

_ACQUIRE = """
local start = redis.call('GET', KEYS[3]) or '0'
-- Built by hand: cjson would print a 16-digit seq in exponent form, losing its last digits.
local token = '{"instance": "' .. ARGV[1] .. '", "turn_id": "' .. ARGV[2] .. '", "start": ' .. start .. '}'
if not redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[3]) then return false end
local orphan = redis.call('GET', KEYS[2]) or ''
redis.call('SET', KEYS[2], token, 'PX', ARGV[4])
return {token, orphan}
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_TAKE_OVER = """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
"""


class LiveUnavailable(MeterchatError):
    """Redis, which carries every session's frames and turns between instances, cannot be reached."""

    code = "live_unavailable"
    retryable = True


class InstanceLost(MeterchatError):
    """The instance running a turn stopped answering; another instance closed the turn."""

    code = "instance_lost"
    retryable = True


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """Redis's errors become the one ``LiveUnavailable`` (translated once, at this boundary)."""
    try:
        yield
    except RedisError as exc:
        raise LiveUnavailable(f"the live side (Redis) is unavailable: {exc}") from exc


def session_key(session_id: str, part: str) -> str:
    return f"{PREFIX}s:{session_id}:{part}"


@dataclass(frozen=True)
class Claim:
    """A token read back: who runs (or ran) which turn, from which seq."""

    token: str
    instance: str
    turn_id: str
    start: int

    @classmethod
    def parse(cls, token: str) -> Claim:
        data: dict[str, Any] = json.loads(token)
        return cls(token, str(data["instance"]), str(data["turn_id"]), int(data.get("start") or 0))


class TurnLease:
    def __init__(self, redis: Redis, instance: str, ttl_ms: int) -> None:
        self.redis = redis
        self.instance = instance
        self.ttl_ms = ttl_ms
        self._acquire = redis.register_script(_ACQUIRE)
        self._extend = redis.register_script(_EXTEND)
        self._release = redis.register_script(_RELEASE)
        self._take_over = redis.register_script(_TAKE_OVER)

    def _keys(self, session_id: str) -> list[str]:
        return [session_key(session_id, "lease"), session_key(session_id, "turn"),
                session_key(session_id, "seq")]

    async def acquire(self, session_id: str, turn_id: str) -> tuple[Claim, Claim | None] | None:
        """Claim the session for ``turn_id``: the claim, and the marker of a turn whose instance
        died and that nobody closed yet (this claim replaces it). None when another turn (on any
        instance) holds the session."""
        async with translated():
            reply = await self._acquire(keys=self._keys(session_id),
                                        args=[self.instance, turn_id, self.ttl_ms, MARKER_TTL_MS])
        if not reply:
            return None
        token, orphan = reply
        return Claim.parse(token), Claim.parse(orphan) if orphan else None

    async def extend(self, session_id: str, claim: Claim) -> bool:
        """The heartbeat; False when the claim is no longer ours (expired, taken over)."""
        async with translated():
            return bool(await self._extend(keys=self._keys(session_id)[:1], args=[claim.token, self.ttl_ms]))

    async def release(self, session_id: str, claim: Claim) -> None:
        async with translated():
            await self._release(keys=self._keys(session_id)[:2], args=[claim.token])

    async def holder(self, session_id: str) -> Claim | None:
        async with translated():
            token = await self.redis.get(session_key(session_id, "lease"))
        return Claim.parse(str(token)) if token else None

    async def orphaned(self, session_ids: list[str]) -> list[tuple[str, Claim]]:
        """Sessions whose turn marker outlived its lease: their instance died mid-turn."""
        if not session_ids:
            return []
        async with translated(), self.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                pipe.get(session_key(session_id, "lease"))
                pipe.get(session_key(session_id, "turn"))
            replies = await pipe.execute()
        return [(session_id, Claim.parse(marker))
                for session_id, lease, marker in zip(session_ids, replies[::2], replies[1::2], strict=True)
                if marker and not lease]

    async def take_over(self, session_id: str, orphan: Claim, turn_id: str) -> Claim | None:
        """Claim a dead instance's session (only one instance wins) and clear its turn marker."""
        token = json.dumps({"instance": self.instance, "turn_id": turn_id, "start": orphan.start})
        async with translated():
            won = await self._take_over(keys=self._keys(session_id)[:2],
                                        args=[orphan.token, token, self.ttl_ms])
        return Claim.parse(token) if won else None
