"""``meterchat --workers 2``: one process that binds the port and supervises two workers, sessions
shared through a private redis-server (tests/redis_support.py) and one SQLite file.

Which worker served a connection is read from the ``x-meterchat-worker`` header of its response (the
WebSocket handshake's too); a test that needs a given worker opens connections until one lands there.
Every wait is for an event: a log line, a frame, a closed socket, a process exit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.web.workers import CRASH_LIMIT, STOP_MARGIN, WORKER_HEADER, Supervisor, worker_count
from tests.processes import LoggedProcess
from tests.redis_support import RedisServer, free_port
from tests.support import Client, client, of_type, text_of
from tests.test_limits import trickle_until_closed

pytestmark = pytest.mark.anyio

READY = re.compile(r"worker (\d+) ready \(pid (\d+)\)")
GRACE_S = 3.0
TRIES = 60  # connections opened to reach one given worker (each lands on either, about evenly)


class Workers(LoggedProcess):
    """One ``python -m server --workers N`` process; ``pids`` follows the ready lines (a replaced
    worker's new pid replaces the old)."""

    def __init__(self, config: Path, count: int = 2) -> None:
        self.port = free_port()
        self.pids: dict[int, int] = {}
        super().__init__([sys.executable, "-m", "server", "--config", str(config), "--port", str(self.port),
                          "--workers", str(count), "--log-level", "info"],
                         lambda: len(self.pids) == count, stop_timeout=GRACE_S + STOP_MARGIN + 5)

    def heard(self, line: str) -> None:
        if match := READY.search(line):
            self.pids[int(match.group(1))] = int(match.group(2))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def write_config(tmp_path: Path, redis: RedisServer, live: bool = True, server: str = "") -> Path:
    config = tmp_path / "meterchat.toml"
    text = (f'[server]\ndata_dir = "{tmp_path / "data"}"\nstore_flush_ms = 50\n'
            f'shutdown_grace_seconds = {GRACE_S}\n{server}'
            f'[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\n'
            f'delay_ms = 30\n')
    if live:
        text += f'[live]\nurl = "{redis.url}"\nlease_ttl_ms = 3000\n'
    config.write_text(text, encoding="utf-8")
    return config


@contextmanager
def workers(tmp_path: Path, redis: RedisServer, server: str = "") -> Iterator[Workers]:
    running = Workers(write_config(tmp_path, redis, server=server))
    try:
        yield running
    finally:
        running.stop()


@asynccontextmanager
async def on_worker(address: str, index: int) -> AsyncIterator[Client]:
    """A client whose socket landed on worker ``index``."""
    for _ in range(TRIES):
        async with client(address) as c:
            if c.ws.response is not None and c.ws.response.headers[WORKER_HEADER] == str(index):
                yield c
                return
    raise AssertionError(f"{TRIES} connections, none on worker {index}")


def test_workers_count_reads_a_number_or_auto():
    assert worker_count("3") == 3 and worker_count("1") == 1
    assert worker_count("auto") == worker_count("0") == (os.cpu_count() or 1)
    for bad in ("-1", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_count(bad)


def test_workers_refused_without_a_live_url(tmp_path, redis_server):
    config = write_config(tmp_path, redis_server, live=False)
    done = subprocess.run([sys.executable, "-m", "server", "--config", str(config), "--port", "0",
                           "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "--workers 2 needs [live] url" in done.stderr and "METERCHAT_LIVE_URL" in done.stderr


async def test_workers_connections_land_on_both_workers(tmp_path, redis_server):
    with workers(tmp_path, redis_server) as running:
        served: set[str] = set()
        for _ in range(TRIES):
            async with httpx.AsyncClient() as http:  # a new connection each time
                response = await http.get(f"http://{running.address}/healthz")
            assert response.status_code == 200
            served.add(response.headers[WORKER_HEADER])
            if len(served) == 2:
                break
        async with on_worker(running.address, 1) as one, on_worker(running.address, 2) as two:
            await one.hello()
            await two.hello()
    assert served == {"1", "2"}
    assert len(set(running.pids.values())) == 2


def test_workers_keep_the_guarded_http_protocol(tmp_path, redis_server):
    """Each worker serves with the head deadline of server.web.serving (a slowloris head is cut off)."""
    with workers(tmp_path, redis_server, "header_timeout_seconds = 1.0\n") as running:
        cut = [trickle_until_closed(running.address, pace=0.2, budget=8.0) for _ in range(2)]
    assert all(after is not None and 0.8 < after < 4.0 for after in cut)


async def test_workers_a_session_resumes_across_workers_mid_stream(tmp_path, redis_server):
    with workers(tmp_path, redis_server) as running:
        async with on_worker(running.address, 1) as first:
            await first.hello()
            seen = await first.start_turn("echo " + " ".join(f"w{n}" for n in range(60)))
            seen += [await first.recv() for _ in range(3)]
        session_id = first.session_id
        async with on_worker(running.address, 2) as second:
            resumed = await second.hello(session_id, seen[-1]["seq"])
            seen += [await second.recv() for _ in range(5)]
        async with on_worker(running.address, 1) as third:
            resumed += await third.hello(session_id, seen[-1]["seq"])
            seen += await third.until("done")
    assert [f["resumed"] for f in of_type(resumed, "session")] == [True, True]
    seqs = [f["seq"] for f in seen]
    assert seqs == sorted(set(seqs))  # nothing twice, nothing out of order
    assert text_of(seen) == seen[-1]["full_response"]  # nothing lost
    assert seen[-1]["full_response"].startswith("w0")


async def test_workers_stop_from_a_connection_on_the_other_worker(tmp_path, redis_server):
    with workers(tmp_path, redis_server) as running:
        async with on_worker(running.address, 1) as on_1, on_worker(running.address, 2) as on_2:
            await on_1.hello()
            await on_2.hello(on_1.session_id)
            await on_1.start_turn()
            await on_2.send("stop")
            assert (await on_1.until("aborted", "done"))[-1]["type"] == "aborted"
            assert (await on_2.until("aborted", "done"))[-1]["type"] == "aborted"


async def test_workers_sigterm_drains_every_worker_within_the_grace(tmp_path, redis_server):
    with workers(tmp_path, redis_server) as running:
        async with on_worker(running.address, 1) as on_1, on_worker(running.address, 2) as on_2:
            seen = []
            for word, c in (("one", on_1), ("two", on_2)):
                await c.hello()
                seen.append(text_of(await c.start_turn("echo " + " ".join([word] * 200))))
            running.process.send_signal(signal.SIGTERM)
            codes = [await closed_with(c) for c in (on_1, on_2)]
        code = await anyio.to_thread.run_sync(running.process.wait, GRACE_S + STOP_MARGIN)
    assert codes == [1012, 1012] and code == 0
    assert "SIGTERM: stopping 2 workers" in "".join(running.lines)
    assert not [line for line in running.lines if "Traceback" in line or "killed" in line]
    stored = stored_replies(tmp_path / "data")
    assert len(stored) == 2 and seen[0].startswith("one") and seen[1].startswith("two")
    for text in seen:  # each worker stored its streaming reply, marked interrupted
        assert [interrupted for content, interrupted in stored if content.startswith(text)] == [1]


async def closed_with(c: Client) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await c.recv(GRACE_S + STOP_MARGIN)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


def stored_replies(data_dir: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(data_dir / "meterchat.sqlite3") as db:
        return db.execute("SELECT content, interrupted FROM messages WHERE role = 'assistant'").fetchall()


async def test_workers_a_killed_worker_is_replaced_and_its_turn_taken_over(tmp_path, redis_server):
    with workers(tmp_path, redis_server) as running:
        async with on_worker(running.address, 2) as watcher:
            async with on_worker(running.address, 1) as on_1:
                await on_1.hello()
                await watcher.hello(on_1.session_id)
                await on_1.start_turn("hello", "q1")
                await watcher.until("chunk")
                killed = running.pids[1]
                os.kill(killed, signal.SIGKILL)
                lost = (await watcher.until("error", "done", timeout=20))[-1]
            running.expect(lambda: running.pids[1] != killed, "replacement for worker 1")
            async with on_worker(running.address, 1) as again:
                await again.hello(watcher.session_id)
                after = await again.say("still there?", id="q2")
    assert lost["type"] == "error" and lost["code"] == "instance_lost"
    assert f"worker 1 (pid {killed}) was killed by SIGKILL; starting it again" in "".join(running.lines)
    assert after[-1]["type"] == "done"


@pytest.mark.parametrize("exit_code, stopped_with", [(2, 2), (3, 3), (1, 1)])
def test_workers_supervisor_stops_on_a_refusal_or_a_crash_loop(exit_code, stopped_with, caplog):
    """A worker that refuses to start (2: a setting, 3: uvicorn's start-up failure) stops the parent
    at once; one that keeps crashing is restarted CRASH_LIMIT times per worker, then the parent stops."""
    command = [sys.executable, "-c", f"raise SystemExit({exit_code})"]
    handler = signal.getsignal(signal.SIGTERM)
    with socket.socket() as sock:
        code = Supervisor(lambda index: command, 2, sock.fileno(), GRACE_S).run()
    assert code == stopped_with
    restarts = [r for r in caplog.records if "starting it again" in r.getMessage()]
    assert len(restarts) == (CRASH_LIMIT * 2 if exit_code == 1 else 0)
    assert signal.getsignal(signal.SIGTERM) == handler  # the test process's handlers are back


def test_workers_each_start_their_own_stdio_mcp_server(tmp_path, redis_server):
    """Every worker process holds its own MCP connections: a stdio server runs once per worker."""
    marker = tmp_path / "mcp-starts"
    server = (f'[mcp_servers.f]\ncommand = {json.dumps(sys.executable)}\n'
              f'args = ["-m", "tests.fakes.mcp_faulty", "--marker", {json.dumps(str(marker))}]\n'
              f'cwd = {json.dumps(str(Path(__file__).resolve().parent.parent))}\n')
    config = write_config(tmp_path, redis_server)
    config.write_text(config.read_text() + server, encoding="utf-8")
    running = Workers(config)
    try:
        pids = set(marker.read_text().split())  # each worker was ready, so its server had started
    finally:
        running.stop()
    assert len(pids) == 2
