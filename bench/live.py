"""Redis round trips per streamed chunk in live mode ([live] url), as Redis itself counts them.

    python bench/live.py [--turns 10] [--words 200] [--delay-ms 0 20] [--watchers 1] [--quick]

Starts a private redis-server and one meterchat server on it (the demo provider echoing ``--words``
words, one chunk each, ``delay_ms`` apart), runs the turns with ``--watchers`` clients on the
session, and reads Redis's ``INFO``: ``total_reads_processed`` (one per request batch a client sends,
so one per round trip) and the calls of the append script and of the tail's ``XREAD``. Prints them
per chunk. Nothing is asserted. ``--quick`` runs one short turn at full pace (about a second), to
check that the bench still works.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_support import RedisServer  # noqa: E402
from tests.support import client, of_type, serve, settings_for  # noqa: E402


async def redis_counts(url: str) -> dict[str, int]:
    redis = Redis.from_url(url, decode_responses=True)
    stats = await redis.info("stats")
    commands = await redis.info("commandstats")
    await redis.aclose()
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in commands.items()}
    return {"reads": int(stats["total_reads_processed"]), "evalsha": calls.get("evalsha", 0),
            "xread": calls.get("xread", 0)}


async def run(address: str, url: str, turns: int, words: int, watchers: int) -> tuple[int, dict[str, int]]:
    text = "echo " + " ".join(f"w{i}" for i in range(words))
    async with AsyncExitStack() as stack:
        main = await stack.enter_async_context(client(address))
        await main.hello()
        others = []
        for _ in range(watchers - 1):
            other = await stack.enter_async_context(client(address))
            await other.hello(main.session_id)
            others.append(other)
        before = await redis_counts(url)
        chunks = 0
        for n in range(turns):
            chunks += len(of_type(await main.say(text, id=f"q{n}"), "chunk"))
            for other in others:
                await other.until("done")
        after = await redis_counts(url)
    return chunks, {key: after[key] - before[key] for key in before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--delay-ms", type=int, nargs="+", default=[0, 20])
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.words, args.delay_ms = 1, 20, [0]
    print(f"live mode: {args.turns} turn(s) of {args.words} words, {args.watchers} client(s) on the session")
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for delay in args.delay_ms:
                demo = {"kind": "demo", "model": "demo-small", "context_window": 1_000_000, "delay_ms": delay}
                settings = settings_for(Path(tmp) / f"d{delay}", {"providers": {"demo": demo},
                                                                  "live": {"url": redis.url}})
                with serve(settings) as address:
                    chunks, used = anyio.run(run, address, redis.url, args.turns, args.words, args.watchers)
                per = {key: round(value / chunks, 3) for key, value in used.items()}
                print(f"delay_ms={delay:>3} chunks={chunks} round trips/chunk={per['reads']} "
                      f"appends/chunk={per['evalsha']} XREADs/chunk={per['xread']}")
        finally:
            redis.stop()
    print("round trips = Redis's total_reads_processed (one per request batch); appends = append scripts")


if __name__ == "__main__":
    main()
