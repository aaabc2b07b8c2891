"""Server overhead per streamed turn, each part in its own process as a user runs it: a fake
OpenAI-style provider, the meterchat server (``python -m server``) and the client (this script).

    python bench/stream.py [--turns 60] [--chunks 200] [--coalesce-ms 0] [--quick]

Baseline, measured in the same run: the same fake streamed straight to an httpx client (the bare
stack). Prints p50/p90 milliseconds per turn for both paths, the overhead per turn and per chunk,
and the ratio. Nothing is asserted. ``--quick`` runs 5 turns of 50 chunks (about a second), to
check the bench still runs. The processes are started by ``tests.support.run_server``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import client, run_server  # noqa: E402


def serve_fake(chunks: int) -> None:
    """Child process: the fake provider, answering every chat with ``chunks`` pieces."""
    import uvicorn

    from tests.fakes import FakeOpenAI, Reply

    fake = FakeOpenAI()
    pieces = [f"w{i} " for i in range(chunks)]
    fake.default = lambda body: Reply(text=pieces, usage=(100, chunks))
    # info: run_server reads the port from uvicorn's "running on" line
    uvicorn.run(fake.app(), host="127.0.0.1", port=0, log_level="info", access_log=False)


async def bare_turn(http: httpx.AsyncClient, url: str) -> float:
    start_at = time.perf_counter()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_lines():
            pass
    return time.perf_counter() - start_at


async def served_turn(c, n: int) -> float:
    start_at = time.perf_counter()
    frames = await c.say(f"turn {n}")
    assert frames[-1]["type"] == "done", frames[-1]
    return time.perf_counter() - start_at


def summary(name: str, seconds: list[float]) -> float:
    ms = sorted(s * 1000 for s in seconds)
    p50, p90 = statistics.median(ms), ms[int(len(ms) * 0.9) - 1]
    print(f"{name:<34} p50 {p50:8.2f} ms   p90 {p90:8.2f} ms")
    return p50


def config(folder: Path, fake: str, coalesce_ms: int) -> Path:
    path = folder / "bench.toml"
    path.write_text(f'[server]\ndata_dir = "{(folder / "data").as_posix()}"\ncoalesce_ms = {coalesce_ms}\n'
                    f'[runtime]\nmax_history_messages = 20\n'
                    f'[providers.p]\nkind = "openai"\nbase_url = "{fake}/v1"\nmodel = "m"\n'
                    f'context_window = 1000000\ntools = false\n')
    return path


async def main(turns: int, chunks: int, coalesce_ms: int) -> None:
    with run_server([__file__, "--serve-fake", "--chunks", str(chunks)]) as fake, \
            tempfile.TemporaryDirectory() as tmp, \
            run_server(config(Path(tmp), fake.url, coalesce_ms)) as server:
        async with httpx.AsyncClient(timeout=30) as http:
            bare = [await bare_turn(http, fake.url) for _ in range(turns)]
        async with client(server.address) as c:
            await c.hello()
            served = [await served_turn(c, n) for n in range(turns)]
    print(f"{turns} turns, {chunks} chunks per reply, coalesce_ms={coalesce_ms}; "
          "three processes on 127.0.0.1")
    b50 = summary("bare stack (fake -> httpx)", bare)
    s50 = summary("meterchat (fake -> server -> ws)", served)
    print(f"overhead per turn p50: {s50 - b50:.2f} ms  ({(s50 - b50) / chunks * 1000:.1f} us per chunk)")
    print(f"ratio meterchat / bare: {s50 / b50:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--coalesce-ms", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.chunks)
    elif args.quick:
        anyio.run(main, 5, 50, args.coalesce_ms)
    else:
        anyio.run(main, args.turns, args.chunks, args.coalesce_ms)
