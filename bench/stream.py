"""Server CPU per streamed chunk, meterchat against a bare relay, each in its own process as a user
runs it: a fake OpenAI-style provider, the server under test and the clients (this script).

    python bench/stream.py [--sessions 1] [--turns 40] [--chunks 200] [--pace-ms 0] [--coalesce-ms 0]
                           [--quick]

Baseline, measured in the same run: a bare Starlette + httpx relay written here (fake -> httpx ->
SSE lines -> one WebSocket text frame per delta), the stack with no meterchat code in it. For each
server the script reads the process's CPU time (user + system, from /proc) before and after the
clients' turns and prints the CPU per chunk, the wall time per turn (p50/p90) and the ratios
meterchat / bare. ``--sessions`` runs that many clients at once (each its own session), so chunks
pile up while the loop is busy. ``--pace-ms`` spaces the fake's pieces (20 = 50 tokens/s), so
replies last long enough for the 250 ms store flushes to count. Nothing is asserted. ``--quick``
runs 3 turns of 50 chunks (about a second), to check the bench still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import Running, client, run_server  # noqa: E402


def serve_fake(chunks: int, pace_ms: int) -> None:
    """Child process: the fake provider, answering every chat with ``chunks`` pieces."""
    import uvicorn

    from tests.fakes import FakeOpenAI, Reply

    fake = FakeOpenAI()
    pieces = [f"w{i} " for i in range(chunks)]
    fake.default = lambda body: Reply(text=pieces, usage=(100, chunks), delay=pace_ms / 1000)
    # info: run_server reads the port from uvicorn's "running on" line
    uvicorn.run(fake.app(), host="127.0.0.1", port=0, log_level="info", access_log=False)


def serve_relay(fake: str) -> None:
    """Child process: the bare relay. Each text the client sends starts one streamed call."""
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    async def relay(ws: WebSocket[Any]) -> None:
        await ws.accept()
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                await ws.receive_text()
                body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                async with http.stream("POST", fake + "/v1/chat/completions", json=body) as response:
                    rest = b""
                    async for data in response.aiter_raw():  # as lean as meterchat's own read
                        *lines, rest = (rest + data).split(b"\n")
                        for line in lines:
                            if line.startswith(b"data: {"):
                                delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                                if delta:
                                    await ws.send_text(json.dumps({"type": "chunk", "content": delta}))
                await ws.send_text('{"type": "done"}')

    app = Starlette(routes=[WebSocketRoute("/ws", relay)])
    uvicorn.run(app, host="127.0.0.1", port=0, log_level="info", access_log=False)


def cpu_seconds(running: Running) -> float:
    assert running.process is not None
    fields = Path(f"/proc/{running.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def bare_session(address: str, turns: int, walls: list[float]) -> None:
    async with connect(f"ws://{address}/ws", max_queue=None) as ws:
        for _ in range(turns):
            start_at = time.perf_counter()
            await ws.send("go")
            while json.loads(await ws.recv())["type"] != "done":
                pass
            walls.append(time.perf_counter() - start_at)


async def served_session(address: str, turns: int, walls: list[float]) -> None:
    async with client(address) as c:
        await c.hello()
        for n in range(turns):
            start_at = time.perf_counter()
            frames = await c.say(f"turn {n}")
            assert frames[-1]["type"] == "done", frames[-1]
            walls.append(time.perf_counter() - start_at)


Session = Callable[[str, int, list[float]], Awaitable[None]]


async def measure(running: Running, session: Session, sessions: int, turns: int
                  ) -> tuple[float, list[float]]:
    walls: list[float] = []
    async with anyio.create_task_group() as tasks:  # warm up: imports, first connections
        tasks.start_soon(session, running.address, 1, [])
    before = cpu_seconds(running)
    async with anyio.create_task_group() as tasks:
        for _ in range(sessions):
            tasks.start_soon(session, running.address, turns, walls)
    return cpu_seconds(running) - before, walls


def config(folder: Path, fake: str, coalesce_ms: int) -> Path:
    path = folder / "bench.toml"
    # The frame rate limit is lifted: each client sends its next message as soon as a turn is done.
    path.write_text(f'[server]\ndata_dir = "{(folder / "data").as_posix()}"\ncoalesce_ms = {coalesce_ms}\n'
                    'frame_rate = 100000\nframe_burst = 100000\n'
                    f'[runtime]\nmax_history_messages = 20\n'
                    f'[providers.p]\nkind = "openai"\nbase_url = "{fake}/v1"\nmodel = "m"\n'
                    f'context_window = 1000000\ntools = false\n')
    return path


def report(name: str, cpu: float, walls: list[float], chunks: int) -> float:
    ms = sorted(s * 1000 for s in walls)
    per_chunk = cpu / chunks * 1e6
    print(f"{name:<28} CPU {per_chunk:7.1f} us/chunk   turn p50 {statistics.median(ms):8.2f} ms"
          f"   p90 {ms[max(int(len(ms) * 0.9) - 1, 0)]:8.2f} ms")
    return per_chunk


async def main(sessions: int, turns: int, chunks: int, coalesce_ms: int, pace_ms: int = 0) -> None:
    total = sessions * turns * chunks
    with run_server([__file__, "--serve-fake", "--chunks", str(chunks), "--pace-ms", str(pace_ms)]) as fake:
        with run_server([__file__, "--serve-relay", fake.url]) as relay:
            bare = await measure(relay, bare_session, sessions, turns)
        with tempfile.TemporaryDirectory() as tmp, \
                run_server(config(Path(tmp), fake.url, coalesce_ms)) as server:
            served = await measure(server, served_session, sessions, turns)
    print(f"{sessions} sessions x {turns} turns x {chunks} chunks ({total:,} chunks), "
          f"pace {pace_ms} ms, coalesce_ms={coalesce_ms}; fake, server and clients in three processes "
          "on 127.0.0.1")
    b = report("bare relay (starlette+httpx)", *bare, total)
    s = report("meterchat", *served, total)
    print(f"meterchat CPU per chunk: {s - b:+.1f} us over the bare relay; ratio {s / b:.2f}x")
    ratio = statistics.median(served[1]) / statistics.median(bare[1])
    print(f"turn p50 ratio meterchat / bare: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--coalesce-ms", type=int, default=0)
    parser.add_argument("--pace-ms", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", metavar="FAKE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.chunks, args.pace_ms)
    elif args.serve_relay:
        serve_relay(args.serve_relay)
    elif args.quick:
        anyio.run(main, 1, 3, 50, args.coalesce_ms)
    else:
        anyio.run(main, args.sessions, args.turns, args.chunks, args.coalesce_ms, args.pace_ms)
