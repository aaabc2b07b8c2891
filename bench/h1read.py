"""The provider read path alone: CPU per 1,000 body chunks read through httpx three ways, in one run.

    python bench/h1read.py [--streams 100] [--chunks 400] [--rounds 3] [--pin] [--syscalls] [--quick]

A raw asyncio server in its own process answers each POST with a chunked SSE body of ``--chunks``
events (one HTTP chunk each, written one at a time so that a reader meets them a few per network
read, as paced model output arrives). This process reads ``--streams`` such replies at once, each
through ``response.aiter_raw()`` (what ``server/providers/_http.py`` reads), with:

- ``httpx``: httpx's default transport (anyio's socket stream, h11);
- ``lean+h11``: httpcore's h11 connections over ``transport.LeanBackend`` (the read path before);
- ``h1``: ``transport.build_transport``, httpcore's pool with ``h1.H1Connection`` (httptools).

Printed: this process's CPU seconds (user + system) per 1,000 chunks, the mean of ``--rounds``
alternated rounds, and the ratio to the ``httpx`` and ``lean+h11`` baselines measured in the same
run. ``--syscalls`` also counts this process's system calls per chunk (``strace -c``, when
installed; strace slows every call, so those rounds' CPU is not used). ``--pin`` puts the readers on
core 0 and the server on core 1. Nothing is asserted; the machine may be shared, so compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpcore
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadkit import procs  # noqa: E402
from server.providers.transport import LeanBackend, build_transport  # noqa: E402

EVENT = b'data: {"choices":[{"delta":{"content":"token"}}]}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def serve(port: int, chunks: int) -> None:
    """Child: answer every request with ``chunks`` chunked SSE events, then wait for the next."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            writer.write(HEAD)
            for n in range(chunks):
                writer.write(CHUNK)
                if n % 4 == 3:
                    await writer.drain()
                    await asyncio.sleep(0)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def client(kind: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    if kind == "httpx":
        return httpx.AsyncClient(limits=limits, timeout=60)
    if kind == "h1":
        return httpx.AsyncClient(transport=build_transport(limits), timeout=60)
    transport = httpx.AsyncHTTPTransport(limits=limits)
    transport._pool = httpcore.AsyncConnectionPool(network_backend=LeanBackend())
    return httpx.AsyncClient(transport=transport, timeout=60)


async def read_all(http: httpx.AsyncClient, url: str, streams: int) -> int:
    async def one() -> int:
        size = 0
        async with http.stream("POST", url, json={"stream": True}) as response:
            async for part in response.aiter_raw():
                size += len(part)
        return size

    sizes = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(sizes) // len(EVENT)


async def measure(kind: str, url: str, streams: int) -> float:
    async with client(kind) as http:
        await read_all(http, url, streams)  # connect and warm up
        started = time.process_time()
        chunks = await read_all(http, url, streams)
        return (time.process_time() - started) / chunks * 1000


def syscalls(kind: str, args: argparse.Namespace, port: int) -> str:
    if not shutil.which("strace"):
        return "strace not installed"
    command = ["strace", "-c", "-f", "-o", "/dev/stderr", sys.executable, __file__, "--role", kind,
               "--port", str(port), "--streams", str(args.streams), "--chunks", str(args.chunks)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    total = next((line.split() for line in out.stderr.splitlines() if line.strip().endswith("total")), [])
    calls = int(total[3]) if len(total) > 3 else 0  # % time, seconds, usecs/call, calls
    return f"{calls / (2 * args.streams * args.chunks):.3f} system calls per chunk"


def run(args: argparse.Namespace) -> None:
    port = procs.free_port()
    log = Path(tempfile.mkdtemp(prefix="h1read-")) / "server.log"
    child = procs.start([__file__, "--role", "server", "--port", str(port), "--chunks", str(args.chunks)],
                        port, "1" if args.pin else None, log)
    try:
        if args.pin:
            os.sched_setaffinity(0, {0})
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        kinds = ["httpx", "lean+h11", "h1"]
        cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                cpu[kind].append(procs.fast_loop().run_until_complete(measure(kind, url, args.streams)))
        print(f"{args.streams} streams x {args.chunks} chunks, {args.rounds} rounds, pinned: {args.pin}, "
              f"load average {os.getloadavg()[0]:.2f}")
        for kind in kinds:
            mean = statistics.mean(cpu[kind])
            print(f"{kind:>9}: {mean:.4f} CPU s per 1,000 chunks (rounds: "
                  f"{', '.join(f'{v:.4f}' for v in cpu[kind])}); "
                  f"{mean / statistics.mean(cpu['httpx']):.2f}x httpx, "
                  f"{mean / statistics.mean(cpu['lean+h11']):.2f}x lean+h11")
        if args.syscalls:
            for kind in kinds:
                print(f"{kind:>9}: {syscalls(kind, args, port)}")
    finally:
        procs.stop(child)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--syscalls", action="store_true")
    parser.add_argument("--quick", action="store_true", help="5 streams x 50 chunks, one round")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.streams, args.chunks, args.rounds = 5, 50, 1
    if args.role == "server":
        procs.fast_loop().run_until_complete(serve(args.port, args.chunks))
    elif args.role:  # one kind's two reads (warm-up and measured), under strace
        url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
        procs.fast_loop().run_until_complete(measure(args.role, url, args.streams))
    else:
        run(args)


if __name__ == "__main__":
    main()
