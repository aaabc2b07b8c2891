"""Live mode ([live] url): two meterchat servers on one store and one private redis-server.

Each server is the real app under uvicorn on 127.0.0.1 (in a thread); clients are real WebSocket
clients. The scenarios that kill a whole server or restart Redis are in test_instances.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from redis.asyncio import Redis

from server.config.settings import LiveSettings
from server.live.channel import RedisChannel
from server.live.lease import TurnLease
from server.live.redis_live import POOL_SIZE, RedisLive
from server.sessions.events import EventBus
from tests.redis_support import RedisServer
from tests.support import SLOW_DEMO, client, of_type, serve, settings_for, text_of

pytestmark = pytest.mark.anyio


def live_settings(tmp_path: Path, url: str, **server: Any):
    return settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}, "live": {"url": url}}, **server)


@contextmanager
def two_servers(tmp_path: Path, redis: RedisServer, **server: Any) -> Iterator[tuple[str, str]]:
    """Two instances sharing the SQLite file in ``tmp_path`` and the Redis."""
    settings = live_settings(tmp_path, redis.url, **server)
    with ExitStack() as stack:
        yield stack.enter_context(serve(settings)), stack.enter_context(serve(settings))


def increasing(frames: list[dict[str, Any]]) -> bool:
    seqs = [frame["seq"] for frame in frames]
    return all(b > a for a, b in zip(seqs, seqs[1:], strict=False))


async def test_live_a_client_on_b_sees_the_turn_a_streams(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            on_a = await a.say("hello there")
            on_b = await b.until("done")
    assert on_a[-1]["type"] == "done" and on_b[-1]["full_response"] == on_a[-1]["full_response"]
    assert text_of(on_b) == on_a[-1]["full_response"]
    assert [f["seq"] for f in on_b if f["type"] != "context"][-1] == on_a[-1]["seq"]
    assert increasing(a.frames[1:]) and increasing(b.frames[1:])
    assert of_type(on_b, "accepted")[0]["content"] == "hello there"


async def test_live_a_sessions_keys_expire_and_their_expiry_is_not_renewed_per_frame(tmp_path, redis_server):
    """The stream and its counter leave Redis a day after the session goes quiet; the expiry is
    set with the first frame and renewed every EXPIRY_EVERY frames, not once per frame."""
    from server.live.append import EXPIRY_EVERY, STREAM_TTL_MS
    from server.live.lease import session_key

    redis = Redis.from_url(redis_server.url, decode_responses=True)
    before = (await redis.info("commandstats")).get("cmdstat_pexpire", {}).get("calls", 0)
    with two_servers(tmp_path, redis_server) as (a_address, _):
        async with client(a_address) as a:
            await a.hello()
            await a.say("hello there")
    calls = (await redis.info("commandstats")).get("cmdstat_pexpire", {}).get("calls", 0) - before
    keys = [session_key(a.session_id, part) for part in ("seq", "frames")]
    ttls = [await redis.pttl(key) for key in keys]
    appended = await redis.xlen(keys[1])
    await redis.aclose()
    assert all(STREAM_TTL_MS - 60_000 < ttl <= STREAM_TTL_MS for ttl in ttls), ttls
    assert appended > 10  # per frame it would have been 2 x appended
    assert calls <= 2 * (2 + appended // EXPIRY_EVERY)


async def test_live_resume_by_last_seq_on_the_other_instance_mid_stream(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a:
            await a.hello()
            seen = await a.start_turn()
            seen += [await a.recv(), await a.recv()]
        last_seq = seen[-1]["seq"]
        async with client(b_address) as b:
            session = (await b.hello(a.session_id, last_seq))[-1]
            rest = await b.until("done")
    assert session["resumed"] is True and session["seq"] == last_seq
    # Dense unless chunks that piled up for the client left as one frame (it carries the last
    # piece's seq: docs/protocol.md), which a loaded machine does; the text says nothing was lost.
    assert rest[0]["seq"] > last_seq and increasing(rest)
    assert text_of(seen) + text_of(rest) == rest[-1]["full_response"]
    assert not of_type(rest, "history")


async def test_live_a_fresh_client_on_b_mid_turn_gets_the_turn_from_its_start(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a:
            await a.hello()
            await a.start_turn("hello", "q1")
            async with client(b_address) as b:
                await b.send("hello", session_id=a.session_id)
                frames = await b.until("done")
    history = of_type(frames, "history")[0]
    assert not [m for m in history["messages"] if m["role"] in ("user", "assistant")]
    assert of_type(frames, "accepted")[0]["id"] == "q1"
    assert text_of(frames) == frames[-1]["full_response"]


async def test_live_stop_sent_to_b_stops_the_turn_running_on_a(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            await a.start_turn()
            await b.send("stop")
            assert (await a.until("aborted", "done"))[-1]["type"] == "aborted"
            assert (await b.until("aborted", "done"))[-1]["type"] == "aborted"


async def test_live_one_turn_at_a_time_across_instances(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            await a.start_turn("hello", "q1")
            await b.send("message", id="q2", content="me too")
            refused = of_type(await b.until("error"), "error")
            assert refused[-1]["code"] == "busy" and refused[-1]["message_id"] == "q2"
            await a.until("done")
            after = await b.say("now me", id="q3")  # the lease is free again, and b knows the reply
    assert after[-1]["type"] == "done"


async def test_live_rename_on_b_reaches_a_client_on_a(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a:
            await a.hello()
            async with httpx.AsyncClient(base_url=f"http://{b_address}") as http:
                answer = await http.patch(f"/api/sessions/{a.session_id}", json={"title": "From B"})
            assert answer.status_code == 200
            assert (await a.until("title"))[-1]["title"] == "From B"


async def test_live_events_on_b_show_a_turn_run_on_a(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with httpx.AsyncClient(base_url=f"http://{b_address}") as http, \
                http.stream("GET", "/events") as events:
            lines = events.aiter_lines()
            assert (await anext(lines)).startswith(": meterchat events")
            async with client(a_address) as a:
                await a.hello()
                done = (await a.say("hello"))[-1]
            with anyio.fail_after(10):
                async for line in lines:
                    if line.startswith("data: ") and json.loads(line[6:])["type"] == "done":
                        event = json.loads(line[6:])
                        break
    assert event["session_id"] == a.session_id and event["seq"] == done["seq"]


async def test_live_seq_stays_increasing_across_instances_and_a_counter_lost_with_redis(redis_server):
    """Frames emitted on two instances interleave in one stream with strictly increasing seqs; a
    counter that Redis lost starts above every seq given before (it is born at the clock)."""
    first, second = (RedisLive(LiveSettings(url=redis_server.url), EventBus()) for _ in range(2))
    async with anyio.create_task_group() as tasks:
        for live in (first, second):
            await live.start(tasks)
        one, two = RedisChannel("seqtest", first), RedisChannel("seqtest", second)
        frames = [channel.emit({"type": "notice", "code": "x", "message": str(n)})
                  for n in range(50) for channel in (one, two)]
        await one.settle()
        await two.settle()
        await first.redis.delete("meterchat:s:seqtest:seq")
        later = one.emit({"type": "notice", "code": "x", "message": "after"})
        await one.settle()
        seqs = sorted(frame["seq"] for frame in frames)
        replay = await second.read_after("seqtest", seqs[0])
        assert replay is not None
        got, end = replay
        tasks.cancel_scope.cancel()
    assert len(set(seqs)) == 100 and later["seq"] > seqs[-1] and end == later["seq"]
    assert [frame["seq"] for frame in got] == seqs[1:] + [later["seq"]]
    assert first.appender.round_trips < first.appender.frames_sent  # queued frames share a round trip
    for live in (first, second):
        await live.aclose()


async def test_live_lease_is_exclusive_and_released_only_by_its_holder(redis_server):
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    mine, theirs = TurnLease(redis, "one", 5000), TurnLease(redis, "two", 5000)
    got = await mine.acquire("leasetest", "t1")
    assert got is not None and got[1] is None and await theirs.acquire("leasetest", "t2") is None
    claim = got[0]
    assert await theirs.extend("leasetest", claim.__class__.parse(claim.token.replace("one", "two"))) is False
    assert await mine.extend("leasetest", claim) is True
    assert await theirs.orphaned(["leasetest"]) == []
    await redis.delete("meterchat:s:leasetest:lease")  # as if its instance stopped beating
    (session_id, orphan), = await theirs.orphaned(["leasetest"])
    taken = await theirs.take_over("leasetest", orphan, "t9")
    assert taken is not None and await mine.take_over("leasetest", orphan, "t8") is None
    await mine.release("leasetest", claim)  # not its lease any more: nothing happens
    assert (await theirs.holder("leasetest")) == taken
    await theirs.release("leasetest", taken)
    assert await theirs.holder("leasetest") is None
    again = await theirs.acquire("leasetest", "t3")
    await redis.delete("meterchat:s:leasetest:lease")  # its instance died; nobody took it over
    replaced = await mine.acquire("leasetest", "t4")
    assert again is not None and replaced is not None and replaced[1] == again[0]  # told, then replaced
    await redis.aclose()


def test_live_settings_are_read_and_checked():
    from server.config.load import settings_from_mapping
    from server.errors import ConfigError

    settings = settings_from_mapping({"live": {"url": "redis://127.0.0.1:1/0"}},
                                     env={"METERCHAT_LIVE_LEASE_TTL_MS": "3000"})
    assert settings.live == LiveSettings(url="redis://127.0.0.1:1/0", lease_ttl_ms=3000)
    assert settings_from_mapping({}, env={}).live.url == ""
    with pytest.raises(ConfigError, match="live.stream_max_frames"):
        settings_from_mapping({"live": {"stream_max_frames": 0}}, env={})


async def test_live_switch_sent_to_b_holds_for_the_next_turn_on_a(tmp_path, redis_server):
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            first = await a.start_turn("hello", "q1")
            await b.send("switch_model", route="demo/demo-open")
            first += await a.until("done")
            second = await a.say("and now?", id="q2")
    assert of_type(first, "route")[0]["model"] == "demo-small"  # a turn finishes on its route
    assert of_type(second, "route")[0]["model"] == "demo-open"



async def test_live_a_message_sent_the_moment_done_arrives_is_taken_on_either_instance(
        tmp_path, redis_server, monkeypatch):
    # The lease goes before the turn's last frame: a client that answers `done` at once, on this
    # instance or another, never finds the lease of the turn that just ended. A slow Redis makes
    # the release take a while, so a `done` sent before it would be seen long before the lease went.
    real = TurnLease.release

    async def slow_release(self: TurnLease, session_id: str, claim: Any) -> None:
        await anyio.sleep(0.3)
        await real(self, session_id, claim)
    monkeypatch.setattr(TurnLease, "release", slow_release)
    with two_servers(tmp_path, redis_server) as (a_address, b_address):
        async with client(a_address) as a, client(b_address) as b:
            await a.hello()
            await b.hello(a.session_id)
            first = await a.say("one")
            await b.until("done")
            on_b = await b.say("two, on b, at once")
            await a.until("done")
            on_a = await a.say("three, on a, at once")
            aborted = await a.start_turn("four, stopped", "q4")
            await a.send("stop")
            aborted += await a.until("done", "error", "aborted")
            after_stop = await a.say("five, at once after the stop")
    assert [turn[-1]["type"] for turn in (first, on_b, on_a, aborted, after_stop)] == \
        ["done", "done", "done", "aborted", "done"]


async def test_live_calibration_is_shared_by_every_instance(redis_server):
    """A ratio learned on one instance is adopted by the others (and by one started later)."""
    from server.live.shared import CALIBRATION_KEY, SharedCalibrations

    redis = Redis.from_url(redis_server.url, decode_responses=True)
    await redis.delete(CALIBRATION_KEY)
    async with anyio.create_task_group() as tasks:
        first, second = (SharedCalibrations(redis, tasks, name) for name in ("one", "two"))
        tasks.start_soon(second.listen)
        with anyio.fail_after(5):
            await second.listening.wait()
        heard = second.changed
        first.observe("demo/demo-small", 1000, 1500)
        with anyio.fail_after(5):
            await heard.wait()
        late = SharedCalibrations(redis, tasks, "three")
        await late.load()
        tasks.cancel_scope.cancel()
    assert first.apply("demo/demo-small", 1000) == second.apply("demo/demo-small", 1000) == 1500
    assert late.apply("demo/demo-small", 1000) == 1500
    await redis.aclose()


async def test_live_a_window_learned_on_one_instance_is_used_by_the_running_others(tmp_path, redis_server):
    """A window named by an overflow error on one instance is stored and heard by an instance that
    is already running: its capacity for the route says so before its next send."""
    from server.live.shared import SharedCalibrations, SharedWindows
    from server.routing.resolver import RouteResolver
    from server.store.backends import open_store

    settings = live_settings(tmp_path, redis_server.url)
    store = open_store(tmp_path)
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    first, second = RouteResolver(settings, {}), RouteResolver(settings, {})
    route = first.parse("demo/demo-small")
    heard = anyio.Event()

    def adopt(provider: str, model: str, tokens: int) -> None:
        second.adopt_window(provider, model, tokens)
        heard.set()

    async with anyio.create_task_group() as tasks:
        for resolver, name, on_window in ((first, "one", first.adopt_window), (second, "two", adopt)):
            shared = SharedCalibrations(redis, tasks, name)
            shared.on_window = on_window
            resolver.remember_windows(SharedWindows(store, redis, name))
            tasks.start_soon(shared.listen)
            with anyio.fail_after(5):
                await shared.listening.wait()
        assert (await second.capacity(route)).source == "config"
        assert await first.learn_window(route, 3000)
        with anyio.fail_after(5):
            await heard.wait()
        tasks.cancel_scope.cancel()
    assert await second.capacity(route) == await first.capacity(route)
    assert (await second.capacity(route)).window == 3000
    assert (await second.capacity(route)).source == "provider_error"
    assert await store.load_windows() == {("demo", "demo-small"): 3000}  # stored once, by the learner
    await store.close()
    await redis.aclose()


async def test_live_a_watcher_fills_a_gap_pub_sub_left_from_the_stream(redis_server):
    """Frames that reached the stream but not the live channel (pub/sub drops what a subscriber
    misses) are read from the stream when the next frame shows the gap: nothing lost, in order."""
    from server.live.lease import session_key
    from server.sessions.channel import Outbox

    writer, watcher = (RedisLive(LiveSettings(url=redis_server.url), EventBus()) for _ in range(2))
    async with anyio.create_task_group() as tasks:
        for live in (writer, watcher):
            await live.start(tasks)
        outbox = Outbox()
        watching = RedisChannel("gaptest", watcher)
        await watching.join(outbox, None, head=lambda seq: {"type": "session", "seq": seq}, snapshot=list)
        first = RedisChannel("gaptest", writer).emit({"type": "notice", "code": "x", "message": "one"})
        got = await taken(outbox, 2, [])
        # Two frames written behind pub/sub's back, as if the watcher had missed their messages.
        for text in ("two", "three"):
            seq = await writer.redis.incr(session_key("gaptest", "seq"))
            await writer.redis.xadd(session_key("gaptest", "frames"), {
                "f": json.dumps({"type": "notice", "code": "x", "message": text}), "o": "elsewhere"},
                id=f"{seq}-0")
        RedisChannel("gaptest", writer).emit({"type": "notice", "code": "x", "message": "four"})
        await taken(outbox, 5, got)
        tasks.cancel_scope.cancel()
    frames = got[1:]
    assert [f["message"] for f in frames] == ["one", "two", "three", "four"]
    assert [f["seq"] for f in frames] == [first["seq"] + n for n in range(4)]
    assert watching.stale  # frames from another instance: the session is read again before use
    for live in (writer, watcher):
        await live.aclose()


async def taken(outbox, count: int, got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drain ``outbox`` into ``got`` until it holds ``count`` frames."""
    with anyio.fail_after(5):
        while len(got) < count:
            await outbox.wait()
            got.extend(packet.decoded() for packet in outbox.take())
    return got


async def test_live_more_calls_in_flight_than_pooled_connections_wait_for_one(redis_server):
    """A busy instance (many turns starting, heartbeats, calibrations) has more Redis calls in flight
    than its pool holds; they wait for a connection instead of failing with "Too many connections",
    which made a heartbeat fail and a live turn be taken over as lost."""
    live = RedisLive(LiveSettings(url=redis_server.url), EventBus())
    seqs: list[int] = []

    async def read() -> None:
        seqs.append(await live.head_seq("pooltest"))

    try:
        async with anyio.create_task_group() as tasks:
            for _ in range(POOL_SIZE + 50):
                tasks.start_soon(read)
    finally:
        await live.aclose()
    assert seqs == [0] * (POOL_SIZE + 50)
