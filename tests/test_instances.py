"""Two meterchat processes (``python -m server``) on one store and one private redis-server.

The scenarios of issue 13 that need whole processes: a client moving between instances mid-stream,
one instance killed mid-stream (the other takes the session over), Redis restarted mid-stream (the
clients get an error or a resume, never a silent hang). Every wait is for an event: a log line, a
frame, a closed socket.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from tests.fakes import Call, Reply
from tests.processes import Server
from tests.redis_support import RedisServer, free_port
from tests.support import Client, client, of_type, text_of

pytestmark = pytest.mark.anyio

ENDINGS = ("done", "aborted", "error")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The store both instances share: one SQLite file, or a fresh database on the private
    PostgreSQL cluster (tests/pg_support.py)."""
    if request.param == "sqlite":
        return ""
    return str(request.getfixturevalue("pg_cluster").new_database())


def write_config(tmp_path: Path, redis: RedisServer, store_url: str, delay_ms: int = 30) -> Path:
    config = tmp_path / "meterchat.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\nstore_flush_ms = 50\n[store]\nurl = "{store_url}"\n'
        f'[live]\nurl = "{redis.url}"\nlease_ttl_ms = 3000\n'
        f'[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\n'
        f'delay_ms = {delay_ms}\n', encoding="utf-8")
    return config


@contextmanager
def instances(tmp_path: Path, redis: RedisServer, store_url: str, count: int = 2) -> Iterator[list[Server]]:
    config = write_config(tmp_path, redis, store_url)
    with ExitStack() as stack:
        started = []
        for _ in range(count):
            instance = Server(config)
            stack.callback(instance.stop)
            started.append(instance)
        yield started


async def until_error_or_close(c: Client, timeout: float = 15) -> list[dict[str, Any]]:
    """Frames until an error frame or the server closing the socket, whichever comes first."""
    got: list[dict[str, Any]] = []
    try:
        while not got or got[-1]["type"] != "error":
            got.append(await c.recv(timeout))
    except ConnectionClosed:
        pass
    return got


async def test_instances_a_client_moves_to_the_other_process_mid_stream(tmp_path, redis_server, store_url):
    with instances(tmp_path, redis_server, store_url) as (a, b):
        async with client(a.address) as first:
            await first.hello()
            seen = await first.start_turn()
            seen += [await first.recv(), await first.recv()]
        async with client(b.address) as second:
            session = (await second.hello(first.session_id, seen[-1]["seq"]))[-1]
            rest = await second.until("done")
    assert session["resumed"] is True
    assert text_of(seen) + text_of(rest) == rest[-1]["full_response"]


async def test_instances_a_client_on_each_process_sees_one_turn(tmp_path, redis_server, store_url):
    with instances(tmp_path, redis_server, store_url) as (a, b):
        async with client(a.address) as on_a, client(b.address) as on_b:
            await on_a.hello()
            await on_b.hello(on_a.session_id)
            await on_b.send("message", id="q1", content="hello from b")
            done_b = (await on_b.until("done"))[-1]
            done_a = (await on_a.until("done"))[-1]
            await on_a.send("stop")  # nothing runs any more: stop is a no-op, not an error
            second = await on_a.say("and from a", id="q2")
            await on_b.until("done")
    assert done_a["full_response"] == done_b["full_response"] and done_a["seq"] == done_b["seq"]
    assert second[-1]["type"] == "done"
    assert [f["content"] for f in of_type(on_b.frames, "accepted")] == ["hello from b", "and from a"]


async def test_instances_stop_from_the_other_process(tmp_path, redis_server, store_url):
    with instances(tmp_path, redis_server, store_url) as (a, b):
        async with client(a.address) as on_a, client(b.address) as on_b:
            await on_a.hello()
            await on_b.hello(on_a.session_id)
            await on_a.start_turn()
            await on_b.send("stop")
            assert (await on_a.until("aborted", "done"))[-1]["type"] == "aborted"
            assert (await on_b.until("aborted", "done"))[-1]["type"] == "aborted"


async def test_instances_one_killed_mid_stream_the_other_takes_over(tmp_path, redis_server, store_url):
    with instances(tmp_path, redis_server, store_url) as (a, b):
        async with client(b.address) as watcher:
            async with client(a.address) as on_a:
                await on_a.hello()
                await watcher.hello(on_a.session_id)
                await on_a.start_turn("hello", "q1")
                await watcher.until("chunk")
                a.kill()
            frames = await watcher.until("error", "done", timeout=20)
            lost = frames[-1]
            after = await watcher.say("still there?", id="q2")
            async with client(b.address) as reader:
                history = (await reader.hello(watcher.session_id))[1]["messages"]
    assert lost["type"] == "error" and lost["code"] == "instance_lost" and lost["retryable"] is True
    assert lost["turn_id"] == of_type(watcher.frames, "accepted")[0]["turn_id"]
    assert after[-1]["type"] == "done"
    users = [m["content"] for m in history if m["role"] == "user"]
    replies = [m for m in history if m["role"] == "assistant"]
    assert users == ["hello", "still there?"]
    assert replies[-1]["interrupted"] is False
    assert all(m["interrupted"] for m in replies[:-1])  # the lost reply, if it reached the store


async def test_instances_redis_restarted_mid_stream_error_or_resume(tmp_path, fresh_redis, store_url):
    with instances(tmp_path, fresh_redis, store_url) as (a, b):
        async with client(a.address) as on_a, client(b.address) as on_b:
            await on_a.hello()
            await on_b.hello(on_a.session_id)
            await on_a.start_turn("hello", "q1")
            await on_b.until("chunk")
            fresh_redis.restart()
            told = [await until_error_or_close(c) for c in (on_a, on_b)]
        for frames in told:  # either an error frame that names the cause, or a closed socket
            errors = of_type(frames, "error")
            assert not errors or errors[-1]["code"] == "live_unavailable"
        last_seq = max(f["seq"] for f in on_b.frames)
        async with client(b.address) as again:
            resumed = await again.hello(on_a.session_id, last_seq)
            assert resumed[0]["type"] == "session" and resumed[0]["resumed"] is True
            after = await turn_after_restart(again)
    assert after["type"] == "done"


async def turn_after_restart(c: Client) -> dict[str, Any]:
    """Send a message until one is accepted (the turn that lost its lease may still say busy), and
    return the frame that ends its turn."""
    for attempt in range(3):
        await c.send("message", id=f"r{attempt}", content="after the restart")
        turn_id = ""
        while True:
            frame = await c.recv()
            if frame["type"] == "accepted" and frame["id"] == f"r{attempt}":
                turn_id = frame["turn_id"]
            elif frame["type"] == "error" and frame.get("message_id") == f"r{attempt}":
                assert frame["code"] == "busy"
                await c.until("aborted", "done", "error")  # the turn that lost its lease ends
                break
            elif turn_id and frame.get("turn_id") == turn_id and frame["type"] in ENDINGS:
                return frame
    raise AssertionError("no message was accepted after the restart")


def test_instances_a_server_that_cannot_reach_redis_does_not_start(tmp_path):
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n'
                      f'[live]\nurl = "redis://127.0.0.1:{free_port()}/0"\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "server", "--config", str(config), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "live.url: cannot reach Redis" in done.stderr


async def test_instances_tool_approval_answered_on_the_other_process(tmp_path, redis_server, fake_openai):
    """A call waiting for approval on one process is answered from a client of the other."""
    time = json.dumps(sys.executable)
    config = write_config(tmp_path, redis_server, "")
    config.write_text(config.read_text() + (
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake_openai.base_url}"\nmodel = "m1"\n'
        f'discover_window = false\n[mcp_servers.time]\ncommand = {time}\n'
        f'args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]\napprove = "always"\n'),
        encoding="utf-8")
    fake_openai.enqueue(Reply(tool_calls=[Call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "t1")]),
                        Reply(text=["evening"]))
    with ExitStack() as stack:
        a, b = (Server(config) for _ in range(2))
        stack.callback(a.stop)
        stack.callback(b.stop)
        async with client(a.address) as on_a, client(b.address) as on_b:
            await on_a.hello()
            await on_a.send("switch_model", route="p/m1")
            await on_a.until("context")
            await on_b.hello(on_a.session_id)
            await on_a.send("message", id="q1", content="time in Tokyo?")
            asked = (await on_b.until("tool_approval"))[-1]
            await on_b.send("tool_decision", turn_id=asked["turn_id"], id="t1", allow=True)
            done = (await on_a.until("done", "error"))[-1]
    assert done["type"] == "done" and done["full_response"] == "evening"
    assert not of_type(on_a.frames, "tool_result")[0]["is_error"]
