"""Accounts across two meterchat processes on one PostgreSQL database and one Redis: a sign-in made on
one instance works on the other, a user reaches none of another's sessions through either (socket,
REST, images, /events fed through Redis), and a sign-out on one instance closes the user's socket on
the other with 4401 within a second."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.exceptions import ConnectionClosed

from tests.accounts_support import add_users, cookie_header, http_as, sign_in
from tests.processes import Server
from tests.redis_support import RedisServer
from tests.support import client, of_type

pytestmark = pytest.mark.anyio


@contextmanager
def two_instances(tmp_path: Path, redis: RedisServer, url: str) -> Iterator[list[Server]]:
    config = tmp_path / "meterchat.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\n[store]\nurl = "{url}"\n[live]\nurl = "{redis.url}"\n'
        '[auth]\nmode = "accounts"\nrevocation_check_ms = 200\n'
        '[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\ndelay_ms = 0\n',
        encoding="utf-8")
    with ExitStack() as stack:
        started = []
        for _ in range(2):
            instance = Server(config)
            stack.callback(instance.stop)
            started.append(instance)
        yield started


async def follow(address: str, cookie: str, seen: list[str], *, task_status: Any) -> None:
    async with http_as(address, cookie) as http, http.stream("GET", "/events") as events:
        lines = events.aiter_lines()
        assert (await anext(lines)).startswith(":")
        task_status.started()
        async for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["session_id"])


async def test_instances_accounts_isolate_users_across_processes(tmp_path, redis_server, pg_cluster):
    url = str(pg_cluster.new_database())
    await add_users(tmp_path / "unused", "admin", "alice", "bob", url=url)
    with two_instances(tmp_path, redis_server, url) as (a, b):
        alice = await sign_in(a.address, "alice")
        bob, admin = await sign_in(b.address, "bob"), await sign_in(b.address, "admin")
        heard: dict[str, list[str]] = {"bob": [], "admin": []}
        async with anyio.create_task_group() as tasks:
            await tasks.start(follow, b.address, bob, heard["bob"])
            await tasks.start(follow, b.address, admin, heard["admin"])
            async with client(a.address, additional_headers=cookie_header(alice)) as c:
                await c.hello()
                accepted = of_type(await c.say("echo on instance a"), "accepted")[0]
            sid = c.session_id
            assert sid is not None
            with anyio.fail_after(10):
                while sid not in heard["admin"]:
                    await anyio.sleep(0.05)
            tasks.cancel_scope.cancel()
        async with client(b.address, additional_headers=cookie_header(bob)) as c:
            taken = await c.hello(sid)
        async with http_as(b.address, bob) as http:
            answers = [await http.get(f"/api/sessions/{sid}"), await http.delete(f"/api/sessions/{sid}"),
                       await http.get(f"/api/sessions/{sid}/export"),
                       await http.patch(f"/api/sessions/{sid}", json={"title": "bob's now"})]
            listed = (await http.get("/api/sessions")).json()
        async with client(b.address, additional_headers=cookie_header(alice)) as c:
            own = await c.hello(sid)  # her cookie from instance a works on b: the store holds it
    assert accepted["content"] == "echo on instance a"
    assert sid not in heard["bob"]
    assert taken[0]["session_id"] != sid and own[0]["session_id"] == sid and own[0]["resumed"] is True
    assert [answer.status_code for answer in answers] == [404, 404, 404, 404]
    assert all(answer.json()["error"]["code"] == "unknown_session" for answer in answers)
    assert sid not in [s["id"] for s in listed]


async def test_instances_accounts_sign_out_on_one_closes_the_socket_on_the_other(
        tmp_path, redis_server, pg_cluster):
    url = str(pg_cluster.new_database())
    await add_users(tmp_path / "unused", "alice", url=url)
    with two_instances(tmp_path, redis_server, url) as (a, b):
        cookie = await sign_in(a.address, "alice")
        async with client(b.address, additional_headers=cookie_header(cookie)) as c:
            await c.hello()
            started = time.monotonic()
            async with http_as(a.address, cookie) as http:
                assert (await http.post("/api/auth/signout", json={})).status_code == 204
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv(timeout=5)
            waited = time.monotonic() - started
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    assert waited < 1.0, waited
