"""Live mode joins what it publishes per session (server/live/append.py): two meterchat servers on
one private redis-server, real WebSocket clients; and ``join_chunks`` on its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from server.live.append import join_chunks
from server.live.channel import RedisChannel
from server.live.lease import session_key
from tests.redis_support import RedisServer
from tests.support import DEMO, SHORT_REPLY, client, of_type, serve, settings_for, text_of

pytestmark = pytest.mark.anyio
WORDS = 40  # the pieces the demo answers SHORT_REPLY with


@contextmanager
def two_servers(tmp_path: Path, redis: RedisServer, delay_ms: int, **live: Any) -> Iterator[tuple[str, str]]:
    settings = settings_for(tmp_path, {"providers": {"demo": {**DEMO, "delay_ms": delay_ms}},
                                       "live": {"url": redis.url, **live}})
    with ExitStack() as stack:
        yield stack.enter_context(serve(settings)), stack.enter_context(serve(settings))


def increasing(frames: list[dict[str, Any]]) -> bool:
    seqs = [frame["seq"] for frame in frames]
    return all(b > a for a, b in zip(seqs, seqs[1:], strict=False))


async def stream_length(redis_server: RedisServer, session_id: str) -> int:
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        return int(await redis.xlen(session_key(session_id, "frames")))
    finally:
        await redis.aclose()


async def test_live_joined_chunks_arrive_in_order_and_complete_on_both_instances(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server, delay_ms=10, coalesce_ms=60) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            on_a = await a.say(SHORT_REPLY)
            on_b = await b.until("done")
        async with client(b_address) as late:  # a resume from the stream sees the joined frames
            await late.hello(a.session_id, last_seq=on_a[0]["seq"])
            replayed = await late.until("done")
    full = on_a[-1]["full_response"]
    assert text_of(on_a) == text_of(on_b) == text_of(replayed) == full and full.count("word") == WORDS
    assert increasing(a.frames[1:]) and increasing(b.frames[1:]) and increasing(replayed[1:])
    chunks = len(of_type(on_b, "chunk"))
    assert 0 < chunks < WORDS  # joined: fewer frames than the provider's pieces
    assert len(of_type(on_a, "chunk")) == chunks
    assert await stream_length(redis_server, a.session_id) < WORDS


async def stream_chunks(redis_server: RedisServer, session_id: str) -> list[str]:
    """The contents of the chunk frames in the session's Redis stream, in order."""
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        entries = await redis.xrange(session_key(session_id, "frames"))
    finally:
        await redis.aclose()
    frames = [json.loads(fields["f"]) for _, fields in entries]
    return [frame["content"] for frame in frames if frame["type"] == "chunk"]


async def test_live_a_joined_frame_stays_within_coalesce_bytes(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server, delay_ms=0, coalesce_ms=200,
                     coalesce_bytes=12) as (a_address, _):
        async with client(a_address) as a:
            await a.hello()
            frames = await a.say(SHORT_REPLY)
    published = await stream_chunks(redis_server, a.session_id)
    assert "".join(published) == text_of(frames) == frames[-1]["full_response"]
    pieces = [len(f"word{n} ") for n in range(WORDS)]
    assert len(published) < WORDS and all(len(text) <= max(12, max(pieces)) for text in published)
    assert any(text.count("word") > 1 for text in published)  # joined, within the bound
    assert increasing(a.frames[1:])


def test_join_chunks_joins_runs_of_one_turn_per_session_and_keeps_order():
    one, two = cast(RedisChannel, object()), cast(RedisChannel, object())

    def chunk(turn: str, text: str) -> dict[str, Any]:
        return {"type": "chunk", "turn_id": turn, "content": text}

    batch = [(one, chunk("t1", "a")), (two, chunk("u1", "x")), (one, chunk("t1", "b")),
             (one, {"type": "route", "turn_id": "t1"}), (one, chunk("t1", "c")), (one, chunk("t2", "d")),
             (two, chunk("u1", "y")), (two, chunk("u1", "z" * 10))]
    joined = join_chunks(batch, limit=5)
    got = [(item.channel is one, item.frame.get("content", item.frame["type"]), item.count)
           for item in joined]
    assert got == [(True, "ab", 2), (False, "xy", 2), (True, "route", 1), (True, "c", 1), (True, "d", 1),
                   (False, "z" * 10, 1)]
    assert batch[0][1]["content"] == "a"  # the emitted frames are not changed
