"""Faults end in clear answers with nothing lost: SIGTERM mid-reply, a store that refuses writes,
and a database that cannot be opened at start-up."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support import SHORT_REPLY, client, run_server

pytestmark = pytest.mark.anyio

EXIT_WITHIN_S = 8.0


def write_config(tmp_path: Path, **server: object) -> Path:
    lines = ["[server]", f'data_dir = "{tmp_path / "data"}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in server.items()]
    lines += ["[providers.demo]", 'kind = "demo"', 'model = "demo-small"', "context_window = 4096",
              "delay_ms = 30"]
    path = tmp_path / "meterchat.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def stored_replies(data_dir: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(data_dir / "meterchat.sqlite3") as db:
        return db.execute("SELECT content, interrupted FROM messages WHERE role = 'assistant'").fetchall()


async def read_events(url: str, lines: list[str], connected: anyio.Event, ended: anyio.Event) -> None:
    async with httpx.AsyncClient() as http, http.stream("GET", f"{url}/events") as response:
        async for line in response.aiter_lines():
            lines.append(line)
            connected.set()  # the stream's first comment: the subscriber is on the bus
    ended.set()


async def test_faults_sigterm_stores_the_streaming_reply_closes_streams_and_exits(tmp_path):
    config = write_config(tmp_path, shutdown_grace_seconds=3.0, store_flush_ms=60000)
    with run_server(config) as running:
        assert running.process is not None
        lines: list[str] = []
        connected, ended = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tasks, client(running.address) as c:
            tasks.start_soon(read_events, running.url, lines, connected, ended)
            await c.hello()
            with anyio.fail_after(10):
                await connected.wait()
            frames = await c.start_turn(SHORT_REPLY)
            frames += [await c.recv() for _ in range(3)]
            seen = "".join(f["content"] for f in frames if f["type"] == "chunk")
            running.process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(await c.recv())
            with anyio.fail_after(EXIT_WITHIN_S):
                await ended.wait()
        code = await anyio.to_thread.run_sync(running.process.wait, EXIT_WITHIN_S)
        elapsed = time.monotonic() - started
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    # uvicorn re-raises the signal it caught once it has shut down: the exit status says SIGTERM.
    assert code in (0, -signal.SIGTERM) and elapsed < EXIT_WITHIN_S
    assert any("Finished server process" in line for line in running.output)
    assert "aborted" in [f["type"] for f in frames]  # the reply was ended, not cut
    # store_flush_ms is a minute: only the shutdown can have written what the client saw.
    [(content, interrupted)] = stored_replies(tmp_path / "data")
    assert content.startswith(seen) and len(seen) > 0 and interrupted == 1
    assert not [line for line in running.output if "Traceback" in line]
