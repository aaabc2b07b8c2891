"""Run the real app on 127.0.0.1 (uvicorn in a thread, lifespan on) and talk to it over a real
WebSocket client (``websockets``)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

from server.app import create_app
from server.config import settings_from_mapping
from tests.fakes.base import stop_server

DEMO = {"kind": "demo", "model": "demo-small", "context_window": 4096, "models": {"demo-open": 0},
        "delay_ms": 0}


SLOW_DEMO = {**DEMO, "delay_ms": 30}  # a reply takes seconds: long enough to stop or reconnect mid-way


def slow_settings(tmp_path: Path, **server: Any):
    """Settings whose demo streams at a pace a test can interrupt."""
    return settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}}, **server)


def settings_for(tmp_path: Path, data: Mapping[str, Any] | None = None, **server: Any):
    data = dict(data or {})
    data.setdefault("providers", {"demo": DEMO})
    data["server"] = {"data_dir": str(tmp_path / "data"), **data.get("server", {}), **server}
    return settings_from_mapping(data, env={})


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        pass


@contextmanager
def serve(settings: Any) -> Iterator[str]:
    """Serve the meterchat app; yields ``127.0.0.1:PORT``."""
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning",
                            timeout_graceful_shutdown=1)
    server = _Server(config)
    thread = threading.Thread(target=server.run, name="meterchat", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("meterchat did not start")
            time.sleep(0.005)
        yield f"127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        stop_server(server, thread)


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
    async with connect(f"ws://{address}/ws{query}", max_size=32 * 1024 * 1024, **options) as ws:
        yield Client(ws)


def of_type(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame["type"] == kind]


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(frame["content"] for frame in of_type(frames, "chunk"))
