"""Server overhead per streamed turn: meterchat between a fake OpenAI-style provider and a WebSocket
client, against the bare stack (the same fake streamed straight to an httpx client) in the same run.

    python bench/stream.py [--turns 40] [--chunks 200]

Prints p50/p90 milliseconds per turn for both paths, the overhead, and the ratio. Nothing asserted.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes import FakeOpenAI, Reply  # noqa: E402
from tests.fakes.base import running  # noqa: E402
from tests.support import client, serve, settings_for  # noqa: E402


async def bare_turn(http: httpx.AsyncClient, url: str) -> float:
    start = time.perf_counter()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with http.stream("POST", url + "/chat/completions", json=body) as response:
        async for _ in response.aiter_lines():
            pass
    return time.perf_counter() - start


async def served_turn(c, n: int) -> float:
    start = time.perf_counter()
    frames = await c.say(f"turn {n}")
    assert frames[-1]["type"] == "done", frames[-1]
    return time.perf_counter() - start


def summary(name: str, seconds: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in seconds)
    p50, p90 = statistics.median(ms), ms[int(len(ms) * 0.9) - 1]
    print(f"{name:<34} p50 {p50:8.2f} ms   p90 {p90:8.2f} ms")
    return p50, p90


async def main(turns: int, chunks: int) -> None:
    fake = FakeOpenAI()
    pieces = [f"w{i} " for i in range(chunks)]
    fake.default = lambda body: Reply(text=pieces, usage=(100, chunks))
    with running(fake, "/v1"), tempfile.TemporaryDirectory() as tmp:
        async with httpx.AsyncClient(timeout=30) as http:
            bare = [await bare_turn(http, fake.base_url) for _ in range(turns)]
        data = {"providers": {"p": {"kind": "openai", "base_url": fake.base_url, "model": "m",
                                    "context_window": 10_000_000, "tools": False}},
                "runtime": {"max_history_messages": 20}}
        with serve(settings_for(Path(tmp), data)) as address:
            async with client(address) as c:
                await c.hello()
                served = [await served_turn(c, n) for n in range(turns)]
    print(f"{turns} turns, {chunks} chunks per reply, fake provider and server on 127.0.0.1")
    b50, _ = summary("bare stack (fake -> httpx)", bare)
    s50, _ = summary("meterchat (fake -> server -> ws)", served)
    print(f"overhead per turn p50: {s50 - b50:.2f} ms  ({(s50 - b50) / chunks * 1000:.1f} us per chunk)")
    print(f"ratio meterchat / bare: {s50 / b50:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--chunks", type=int, default=200)
    args = parser.parse_args()
    anyio.run(main, args.turns, args.chunks)
