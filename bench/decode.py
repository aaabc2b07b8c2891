"""Per-chunk cost of the provider read side: the SSE decoder alone, and a whole provider stream read
(httpx + decoder + the OpenAI dialect's state) from a fake provider in its own process.

    python bench/decode.py [--chunks 2000] [--turns 20] [--paced-ms 1]

Each figure has a baseline measured in the same run, and the ratio is what to compare between
commits (machines differ, ratios less so):
- decoder: ``SSEDecoder`` + ``json.loads`` per event, against the least any decoder must do
  (``bytes.split`` on blank lines + ``json.loads``), fed one event per chunk (a paced stream) and in
  4 KiB pieces (a full-speed stream);
- provider read: ``OpenAIProvider.stream`` against ``httpx`` ``aiter_lines`` + ``json.loads``, at full
  speed and paced (``--paced-ms`` between events, each its own network read, as a model streams
  them); both as this process's CPU time per chunk, which a busy shared machine disturbs less than
  wall time.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.config.settings import ProviderProfile  # noqa: E402
from server.history.messages import ChatMessage  # noqa: E402
from server.providers.base import ProviderRequest  # noqa: E402
from server.providers.decoders import SSEDecoder  # noqa: E402
from server.providers.openai import OpenAIProvider  # noqa: E402
from tests.support import run_server  # noqa: E402


def sample_stream(chunks: int) -> list[bytes]:
    """One OpenAI chat.completion.chunk event per token, as a real provider sends them."""
    events = []
    for index in range(chunks):
        body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": {"content": f"w{index} "}, "finish_reason": None}]}
        events.append(f"data: {json.dumps(body)}\n\n".encode())
    return events


def pieces(events: list[bytes], size: int) -> list[bytes]:
    data = b"".join(events)
    return [data[i : i + size] for i in range(0, len(data), size)]


def decoder_run(chunks: list[bytes]) -> int:
    decoder = SSEDecoder()
    count = 0
    for chunk in chunks:
        for event in decoder.feed(chunk):
            json.loads(event.data)
            count += 1
    return count


def baseline_run(chunks: list[bytes]) -> int:
    pending = b""
    count = 0
    for chunk in chunks:
        parts = (pending + chunk).split(b"\n\n")
        pending = parts.pop()
        for part in parts:
            json.loads(part[6:])
            count += 1
    return count


def best_us(run: Callable[[list[bytes]], int], chunks: list[bytes], events: int, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        assert run(chunks) == events
        best = min(best, time.perf_counter() - start)
    return best / events * 1e6


def decoder_figures(chunks: int) -> None:
    events = sample_stream(chunks)
    for name, feed in (("one event per chunk", events), ("4 KiB pieces", pieces(events, 4096))):
        ours, floor = best_us(decoder_run, feed, chunks), best_us(baseline_run, feed, chunks)
        print(f"decoder, {name:<20} {ours:6.2f} us/event   baseline {floor:6.2f}   "
              f"ratio {ours / floor:5.2f}x")


def serve_fake(chunks: int, paced_ms: float) -> None:
    """Child process: the fake provider, ``chunks`` pieces a reply, ``paced_ms`` between them."""
    import uvicorn

    from tests.fakes import FakeOpenAI, Reply

    fake = FakeOpenAI()
    pieces = [f"w{i} " for i in range(chunks)]
    fake.default = lambda body: Reply(text=pieces, usage=(100, chunks), delay=paced_ms / 1000)
    # info: run_server reads the port from uvicorn's "running on" line
    uvicorn.run(fake.app(), host="127.0.0.1", port=0, log_level="info", access_log=False)


async def provider_turn(provider: OpenAIProvider) -> int:
    count = 0
    async for _ in provider.stream(ProviderRequest("m", [ChatMessage("user", "hi")])):
        count += 1
    return count


async def bare_turn(http: httpx.AsyncClient, url: str) -> int:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    count = 0
    async with http.stream("POST", url + "/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                json.loads(line[6:])
                count += 1
    return count


async def best(turns: int, turn: Callable[[], Awaitable[int]], clock: Callable[[], float]) -> float:
    times = []
    for _ in range(turns):
        start = clock()
        await turn()
        times.append(clock() - start)
    return min(times)


async def read_figures(turns: int, chunks: int, paced_ms: float) -> None:
    with run_server([__file__, "--serve-fake", "--chunks", str(chunks), "--paced-ms", str(paced_ms)]) as fake:
        url = fake.url + "/v1"
        provider = OpenAIProvider(ProviderProfile("p", "openai", base_url=url))
        async with httpx.AsyncClient(timeout=30) as http:
            await bare_turn(http, url)  # warm both paths (connections, imports)
            await provider_turn(provider)
            clock = time.process_time  # CPU of this process: what a chunk costs the server
            bare = await best(turns, lambda: bare_turn(http, url), clock)
            ours = await best(turns, lambda: provider_turn(provider), clock)
        await provider.aclose()
    what = f"paced {paced_ms:g} ms" if paced_ms else "full speed"
    print(f"provider read ({what}, best of {turns}) {ours / chunks * 1e6:6.2f} us/chunk   "
          f"httpx aiter_lines + json {bare / chunks * 1e6:6.2f}   ratio {ours / bare:5.2f}x")


def main(chunks: int = 2000, turns: int = 20, paced_ms: float = 1.0) -> None:
    decoder_figures(chunks)
    anyio.run(read_figures, turns, chunks, 0.0)
    if paced_ms:
        anyio.run(read_figures, 3, chunks // 4, paced_ms)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--paced-ms", type=float, default=1.0)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a few hundred chunks, no paced run")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.turns, args.paced_ms = 200, 2, 0.0
    if args.serve_fake:
        serve_fake(args.chunks, args.paced_ms)
    else:
        main(args.chunks, args.turns, args.paced_ms)
