"""Run a real server on 127.0.0.1 (``run_server``: uvicorn in a thread, or ``python -m server`` in a
child process) and talk to it over a real WebSocket client (``websockets``)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

from server.config.load import settings_from_mapping
from server.web.app import create_app

REPO = Path(__file__).resolve().parent.parent
DEMO = {"kind": "demo", "model": "demo-small", "context_window": 4096, "models": {"demo-open": 0},
        "delay_ms": 0}


SLOW_DEMO = {**DEMO, "delay_ms": 30}  # a reply takes seconds: long enough to stop or reconnect mid-way
# A message the demo answers with 40 pieces: about a second at the slow pace, time enough to attach
# a second client mid-stream without waiting for the demo's long default answer.
SHORT_REPLY = "echo " + " ".join(f"word{n}" for n in range(40))


def slow_settings(tmp_path: Path, **server: Any):
    """Settings whose demo streams at a pace a test can interrupt."""
    return settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}}, **server)


def settings_for(tmp_path: Path, data: Mapping[str, Any] | None = None, **server: Any):
    data = dict(data or {})
    data.setdefault("providers", {"demo": DEMO})
    data["server"] = {"data_dir": str(tmp_path / "data"), **data.get("server", {}), **server}
    return settings_from_mapping(data, env={})


START_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@dataclass
class Running:
    """A server started by ``run_server``: where it listens and, when it is a child process, the
    process and every line it printed."""

    address: str  # 127.0.0.1:PORT
    process: subprocess.Popen[bytes] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@contextmanager
def run_server(target: Any, **options: Any) -> Iterator[Running]:
    """Serve on 127.0.0.1, on a free port, until the block ends; the one way a test runs a server.

    ``target`` an ASGI app: uvicorn in a thread of this process (``options`` go to
    ``uvicorn.Config``). ``target`` a settings file (a ``Path``): ``python -m server --config FILE``
    in a child process, the way a user starts it. ``target`` a list: ``python *target`` in a child
    that serves with uvicorn on 127.0.0.1 port 0 at log level info (a bench's fake provider). Either
    way the caller waits for the server's own word that it listens, not for a timer."""
    if isinstance(target, Path):
        target = ["-m", "server", "--config", str(target), "--host", "127.0.0.1", "--port", "0",
                  "--log-level", "info"]  # info: uvicorn's "running on" line names the port it bound
    runner = _in_process if isinstance(target, list) else _in_thread
    with runner(target, **options) as running:
        yield running


@contextmanager
def serve(settings: Any) -> Iterator[str]:
    """Serve the meterchat app built from ``settings``; yields ``127.0.0.1:PORT``."""
    with run_server(create_app(settings)) as running:
        yield running.address


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    def install_signal_handlers(self) -> None:  # older uvicorn; signals belong to the main thread
        pass

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    def run_until_stopped(self) -> None:
        try:
            self.run()
        finally:
            self.ready.set()  # a start-up that failed wakes the waiter too


@contextmanager
def _in_thread(app: Any, **options: Any) -> Iterator[Running]:
    settings = {"log_level": "warning", "timeout_graceful_shutdown": 1, **options}
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, **settings))
    thread = threading.Thread(target=server.run_until_stopped, name="test-server", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(START_TIMEOUT_S) or not server.started:
            raise RuntimeError("the server did not start")
        yield Running(f"127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
    finally:
        stop_server(server, thread)


def stop_server(server: uvicorn.Server, thread: threading.Thread) -> None:
    """Ask the server to exit; if a connection holds it (a stream a test left hanging), force it, and
    never wait forever: the thread is a daemon, so a stuck one cannot keep the test run alive."""
    server.should_exit = True
    thread.join(5)
    if thread.is_alive():
        server.force_exit = True
        thread.join(5)


@contextmanager
def _in_process(args: list[str]) -> Iterator[Running]:
    process = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    running = Running("", process)
    listening = threading.Event()
    reader = threading.Thread(target=_read_output, args=(running, listening), daemon=True)
    reader.start()
    try:
        if not listening.wait(START_TIMEOUT_S) or not running.address:
            raise RuntimeError(f"{' '.join(args)} did not start:\n" + "".join(running.output[-80:]))
        yield running
    finally:
        _stop_process(process)
        reader.join(5)


def _read_output(running: Running, listening: threading.Event) -> None:
    """Keep every line the child prints (so its pipe never fills) and note the port it bound."""
    assert running.process is not None and running.process.stdout is not None
    with running.process.stdout as stream:
        for raw in stream:
            line = raw.decode(errors="replace")
            running.output.append(line)
            match = _LISTENING.search(line)
            if match and not listening.is_set():
                running.address = f"127.0.0.1:{match.group(1)}"
                listening.set()
    listening.set()  # the child ended before it listened: wake the waiter


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Client:
    """A protocol-v1 client that keeps every frame it received, in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.session_id: str | None = None

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send(json.dumps({"type": kind, **fields}))

    async def send_raw(self, text: str) -> None:
        await self.ws.send(text)

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            frame = json.loads(await self.ws.recv())
        self.frames.append(frame)
        if frame["type"] == "session":
            self.session_id = frame["session_id"]
        return frame

    async def until(self, *kinds: str, timeout: float = 10) -> list[dict[str, Any]]:
        """Frames received up to and including the first whose type is in ``kinds``."""
        got = []
        while True:
            frame = await self.recv(timeout)
            got.append(frame)
            if frame["type"] in kinds:
                return got

    async def hello(self, session_id: str | None = None, last_seq: int | None = None
                    ) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {}
        if session_id:
            fields["session_id"] = session_id
        if last_seq is not None:
            fields["last_seq"] = last_seq
        await self.send("hello", **fields)
        return await self.until("context" if last_seq is None else "session")

    async def start_turn(self, content: str = "hello", message_id: str = "q1") -> list[dict[str, Any]]:
        """Send a message and collect frames until its reply has begun (the first chunk)."""
        await self.send("message", id=message_id, content=content)
        return await self.until("chunk")

    async def say(self, content: str, **fields: Any) -> list[dict[str, Any]]:
        """Send a message and collect frames until the turn ends (done, error or aborted)."""
        await self.send("message", id=fields.pop("id", uuid.uuid4().hex), content=content, **fields)
        return await self.until("done", "error", "aborted")


@asynccontextmanager
async def client(address: str, query: str = "", **options: Any) -> AsyncIterator[Client]:
    # A test reads only the frames it asserts on. With a bounded queue the client stops reading the
    # socket once it is full, so leaving the block waited out the close timeout (10 s) for a close
    # frame stuck behind unread chunks; unbounded, it keeps reading and closes at once.
    async with connect(f"ws://{address}/ws{query}", max_size=32 * 1024 * 1024, max_queue=None,
                       **options) as ws:
        yield Client(ws)


def of_type(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame["type"] == kind]


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(frame["content"] for frame in of_type(frames, "chunk"))


def iterations_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool],
                     most: int) -> asyncio.Future[int]:
    """How many loop iterations pass before ``done()``: a callback that reschedules itself counts
    one per iteration (call_soon runs what was scheduled before the iteration began)."""
    counted = loop.create_future()

    def tick(n: int) -> None:
        if done() or n >= most:
            counted.set_result(n)
        else:
            loop.call_soon(tick, n + 1)

    loop.call_soon(tick, 0)
    return counted
