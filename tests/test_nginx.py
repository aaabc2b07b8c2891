"""deploy/nginx.conf, the file operators copy, run by a private nginx in front of two meterchat
processes (``python -m server``) sharing one private redis-server and one store.

Only the ``listen`` line and the upstream addresses are changed (bench/loadkit/nginx.py). Every
request below goes through nginx: the page and /api, the Host allow-list and the Origin check
(which hold only if nginx passes the browser's Host), request bodies up to the import bound, a
streamed turn, /events, and a reconnect that nginx sends to the other instance after the first one
was killed mid-stream. Every wait is for an event: a log line, a frame, a closed socket. Without the
nginx binary these tests fail and say what to install.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from bench.loadkit import nginx
from tests.processes import LoggedProcess, Server
from tests.redis_support import RedisServer, free_port
from tests.support import client, of_type

pytestmark = pytest.mark.anyio

PUBLIC = "chat.example.com"  # the public name of deploy/nginx.conf, in allowed_hosts below


class Stack:
    """nginx on ``port`` in front of ``instances``."""

    def __init__(self, port: int, instances: list[tuple[int, Server]], proxy: LoggedProcess) -> None:
        self.port, self.instances, self.proxy = port, instances, proxy

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def serving(self, session_id: str | None) -> Server:
        """The instance that accepted the socket opened with ``?session=<session_id>``."""
        mark = f"/ws?session={session_id}"
        for timeout in (0, 5):  # logged before the first frame was sent, but read by another thread
            for _, instance in self.instances:
                if instance.wait_for(mark, timeout):
                    return instance
        raise AssertionError(f"no instance logged {mark}")


def start_instance(config: Path) -> tuple[int, Server]:
    server = Server(config)
    return server.port, server


def start_nginx(folder: Path, upstreams: list[str]) -> tuple[int, LoggedProcess]:
    try:
        nginx.binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    for _ in range(3):
        port = free_port()
        try:
            return port, LoggedProcess(nginx.command(folder, nginx.write_config(folder, upstreams, port)),
                                       nginx.READY)
        except RuntimeError:
            continue
    raise RuntimeError("nginx did not start")


def write_config(tmp_path: Path, redis: RedisServer, store_url: str) -> Path:
    config = tmp_path / "meterchat.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\nstore_flush_ms = 50\nallowed_hosts = ["{PUBLIC}"]\n'
        f'[store]\nurl = "{store_url}"\n[live]\nurl = "{redis.url}"\nlease_ttl_ms = 3000\n'
        '[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\ndelay_ms = 30\n',
        encoding="utf-8")
    return config


@contextmanager
def proxied(tmp_path: Path, redis: RedisServer, store_url: str = "") -> Iterator[Stack]:
    config = write_config(tmp_path, redis, store_url)
    folder = nginx.make_folder()
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        instances = []
        for _ in range(2):
            port, instance = start_instance(config)
            stack.callback(instance.stop)
            instances.append((port, instance))
        port, proxy = start_nginx(folder, [f"127.0.0.1:{p}" for p, _ in instances])
        stack.callback(proxy.stop)
        yield Stack(port, instances, proxy)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Stack]:
    with proxied(tmp_path_factory.mktemp("nginx"), redis_server) as running:
        yield running


def test_nginx_serves_the_page_and_the_api(stack: Stack) -> None:
    page = httpx.get(stack.url + "/")
    sessions = httpx.get(stack.url + "/api/sessions")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert sessions.status_code == 200 and isinstance(sessions.json(), list)
    assert httpx.get(stack.url + "/healthz").status_code == 200


def test_nginx_passes_the_host_so_the_allow_list_holds(stack: Stack) -> None:
    allowed = httpx.get(stack.url + "/", headers={"Host": f"{PUBLIC}:{stack.port}"})
    refused = httpx.get(stack.url + "/", headers={"Host": f"evil.example:{stack.port}"})
    assert allowed.status_code == 200
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_host"


async def test_nginx_a_page_on_the_public_name_may_change_state(stack: Stack) -> None:
    async with client(stack.address) as c:
        await c.hello()
    page = f"{PUBLIC}:{stack.port}"  # a browser on a non-default port: Origin and Host carry it

    def rename(origin: str) -> httpx.Response:
        return httpx.patch(f"{stack.url}/api/sessions/{c.session_id}", json={"title": "renamed"},
                           headers={"Host": page, "Origin": origin})

    same_origin, other_origin = rename(f"http://{page}"), rename("http://evil.example")
    assert same_origin.status_code == 200 and same_origin.json()["title"] == "renamed"
    assert other_origin.status_code == 403 and other_origin.json()["error"]["code"] == "forbidden_origin"


async def test_nginx_keeps_a_session_on_one_instance(stack: Stack) -> None:
    async with client(stack.address) as first:
        await first.hello()
    for _ in range(4):  # round-robin would alternate; the hash on ?session= does not
        async with client(stack.address, f"?session={first.session_id}") as again:
            await again.hello(first.session_id)
    chosen = stack.serving(first.session_id)
    other = next(p for _, p in stack.instances if p is not chosen)
    assert chosen.wait_for(f"/ws?session={first.session_id}", count=4)
    assert not other.wait_for(f"/ws?session={first.session_id}", 0)


def test_nginx_admits_bodies_up_to_the_import_bound(stack: Stack) -> None:
    def post(size: int) -> httpx.Response:
        body = json.dumps({"pad": "x" * size}).encode()
        return httpx.post(stack.url + "/api/sessions/import", content=body,
                          headers={"Content-Type": "application/json"}, timeout=60)

    reached = post(4 * 1024 * 1024)  # past nginx's default 1m: meterchat itself judges it
    refused = post(33 * 1024 * 1024)  # past the 32 MiB bound: nginx answers, the instance never reads it
    assert reached.status_code == 400 and "error" in reached.json()
    assert refused.status_code == 413 and "nginx" in refused.text


def test_nginx_a_head_and_its_body_in_one_read_are_served(stack: Stack) -> None:
    """nginx writes a request's head and the start of its body at once, and an instance that is
    busy reads both in one go. Only the head counts toward max_header_bytes (body bytes counted too
    cut such imports off with a reset, at random). Stopping the instance while the request is sent
    makes that one read certain."""
    port, instance = stack.instances[0]
    body = json.dumps({"pad": "x" * 400_000}).encode()
    head = (f"POST /api/sessions/import HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    request = head + body
    with socket.create_connection(("127.0.0.1", port)) as raw:
        instance.process.send_signal(signal.SIGSTOP)
        try:
            buffered = send_what_the_kernel_takes(raw, request)
        finally:
            instance.process.send_signal(signal.SIGCONT)
        raw.sendall(request[buffered:])
        answer = b"".join(iter(lambda: raw.recv(65536), b""))
    assert buffered > 65536 + len(head)  # more than the head bound waited in one piece
    assert answer.startswith(b"HTTP/1.1 400") and b"import_rejected" in answer


def send_what_the_kernel_takes(raw: socket.socket, data: bytes) -> int:
    raw.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            sent += raw.send(data[sent:sent + 65536])
    except BlockingIOError:
        pass
    raw.setblocking(True)
    return sent


async def test_nginx_streams_a_turn_chunk_by_chunk(stack: Stack) -> None:
    async with client(stack.address) as c:
        await c.hello()
        await c.start_turn("tell me a long story", "q1")
        # The first chunk arrived while the reply was still being written: stop ends it early.
        await c.send("stop")
        ending = (await c.until("aborted", "done"))[-1]
    assert ending["type"] == "aborted"


async def test_nginx_streams_events(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as http, http.stream("GET", stack.url + "/events") as events:
        lines = events.aiter_lines()
        async with client(stack.address) as c:
            await c.hello()
            await c.send("message", id="q1", content="tell me a long story")
            route = await next_event(lines, "route", c.session_id)
            # The turn's first event came while its reply was still streaming: stop ends it early.
            await c.send("stop")
            ending = (await c.until("aborted", "done"))[-1]
    assert route["turn_id"] == ending["turn_id"] and ending["type"] == "aborted"


async def next_event(lines: Any, kind: str, session_id: str | None) -> dict[str, Any]:
    """The next ``kind`` event of ``session_id`` on the SSE stream (the response never ends, so
    every event read here was passed on by nginx as it came)."""
    async for line in lines:
        if line.startswith("data: "):
            event: dict[str, Any] = json.loads(line[6:])
            if event["type"] == kind and event.get("session_id") == session_id:
                return event
    raise AssertionError(f"/events ended before a {kind} event")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
async def test_nginx_resume_on_the_other_instance_after_a_kill(tmp_path: Path, redis_server: RedisServer,
                                                               store: str, request: pytest.FixtureRequest
                                                               ) -> None:
    store_url = "" if store == "sqlite" else str(request.getfixturevalue("pg_cluster").new_database())
    with proxied(tmp_path, redis_server, store_url) as running:
        async with client(running.address) as first:
            await first.hello()
        query = f"?session={first.session_id}"  # as the page sends it: nginx hashes it
        async with client(running.address, query) as streaming:
            await streaming.hello(first.session_id)
            seen = await streaming.start_turn("tell me a long story", "q1")
            victim = running.serving(first.session_id)
            victim.kill()
            with pytest.raises(ConnectionClosed):
                await streaming.until("done", timeout=10)
        last_seq = max(f["seq"] for f in streaming.frames if "seq" in f)
        async with client(running.address, query) as resumed:
            session = (await resumed.hello(first.session_id, last_seq))[-1]
            lost = (await resumed.until("error", "done", timeout=20))[-1]
            after = await resumed.say("still there?", id="q2")
        survivor = next(i for _, i in running.instances if i is not victim)
    assert of_type(seen, "chunk") and session["resumed"] is True
    assert survivor.wait_for(f"/ws{query}", 0)  # nginx sent the reconnect to the live instance
    assert lost["type"] == "error" and lost["code"] == "instance_lost"
    seqs = [f["seq"] for f in resumed.frames if "seq" in f and f["type"] != "session"]
    assert seqs == sorted(seqs) and all(seq > last_seq for seq in seqs)
    assert after[-1]["type"] == "done"
