"""Load: N concurrent sessions, each streaming a long reply paced at 50 tokens/s, read three ways in
one run: straight from the fake provider (direct), through a bare Starlette relay written here
(websocket in, httpx stream out, no meterchat code), and through meterchat. Every part runs in its
own process: the fake provider, the server under test, the clients.

    .venv/bin/python bench/load.py                      # N = 100, 300, 1000 and the first-chunk mode
    .venv/bin/python bench/load.py --quick              # N = 20 for a few seconds
    .venv/bin/python bench/load.py --sessions 300 --pin # server on core 0, fake + clients on core 1
    .venv/bin/python bench/load.py --loop asyncio --ws wsproto   # measure a uvicorn option
    .venv/bin/python bench/load.py --sessions 300 --paths direct --instances 1,2   # behind nginx

Each token carries the fake's monotonic-ns stamp, so a client times every chunk against the moment
the provider wrote it. Printed per N: chunk delay p50/p99 and the delay added over direct, first-chunk
delay added, chunks lost or reordered, the server's CPU seconds per 1,000 chunks and share of a core,
its RSS growth per session, the clients' own CPU share, and ratios to the bare relay. After several N,
the most streams each path held within ``--within`` ms of added p99 (every reply finished), and
meterchat's against the relay's: streams per core at the same p99 when pinned. With
``--instances 1,2``: the same sessions through nginx (deploy/nginx.conf) to one and to two meterchat
processes sharing a private Redis, with nginx's and Redis's CPU and the Redis round trips per chunk.
Nothing is asserted. Everything binds 127.0.0.1, every phase has a deadline, and every child is stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loadkit import runner  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/load.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="100,300,1000", help="comma-separated N values")
    parser.add_argument("--first-chunk", default="1,10,100", help="concurrencies of the first-chunk mode "
                        "('' to skip)")
    parser.add_argument("--seconds", type=float, default=20, help="length of each paced reply")
    parser.add_argument("--rate", type=int, default=50, help="tokens per second of each reply")
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds over which sessions start")
    parser.add_argument("--within", type=float, default=100.0, help="after several N: the most streams "
                        "each path held with every reply finished and +p99 at most this many ms")
    parser.add_argument("--paths", default="direct,relay,meterchat", help="which paths to measure")
    parser.add_argument("--quick", action="store_true", help="N=20, 1.5 s replies, no first-chunk mode")
    parser.add_argument("--pin", action="store_true", help="taskset: server on core 0, the rest on core 1")
    parser.add_argument("--workers", type=int, help="passed to meterchat when its CLI has --workers "
                        "(above 1 with a private Redis as [live] url)")
    parser.add_argument("--instances", default="", help="comma-separated N values: also measure N "
                        "meterchat processes behind nginx (deploy/nginx.conf) on a private Redis")
    parser.add_argument("--loop", help="uvicorn loop for meterchat and the relay (auto|asyncio|uvloop)")
    parser.add_argument("--http", help="uvicorn HTTP parser (auto|h11|httptools)")
    parser.add_argument("--ws", help="uvicorn WebSocket implementation "
                        "(auto|websockets|websockets-sansio|wsproto)")
    parser.add_argument("--abuse", action="store_true", help="beside meterchat's sessions: a client that "
                        "never reads, a bad-frame flood and an oversized frame")
    parser.add_argument("--setting", action="append", default=[], help="a [server] setting for "
                        "meterchat, as in its TOML (repeatable): --setting 'store_flush_ms = 2000'")
    parser.add_argument("--keep-logs", action="store_true", help="print where the children's logs are")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.first_chunk, args.seconds, args.ramp = "20", "", 1.5, 0.2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.role:
        runner.play_role(args.role, args.spec or "{}")
    else:
        runner.run(args)


if __name__ == "__main__":
    main()
