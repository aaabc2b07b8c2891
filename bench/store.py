"""What saving a streaming reply costs per chunk: on every chunk, or at 250 ms intervals.

Run ``python bench/store.py [--chunks 2000] [--chunk-ms 20] [--flush-ms 250] [--quick]``. A reply of
``--chunks`` pieces is streamed into a ``ChatMessage`` three ways, in the same run:

- baseline: append each chunk to a Python string (the floor of the hot path);
- every chunk: ``save_messages`` after each chunk (what DESIGN.md section 5 forbids);
- interval: ``save_messages`` when ``--flush-ms`` of stream time has passed since the last save,
  and once at the end. Stream time is simulated (a chunk every ``--chunk-ms``) so the run does not
  sleep; the figure is the real work per chunk.

Prints figures and ratios; asserts nothing. Best of three runs each. ``--quick`` streams 500 chunks
(about a second), to check the bench still runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.history.messages import ChatMessage  # noqa: E402
from server.store.backends import open_store  # noqa: E402
from server.store.sqlite import SqliteStore  # noqa: E402

CHUNK = "some reply text "  # 16 bytes, about four tokens
REPEATS = 3


async def baseline(chunks: int) -> int:
    content = ""
    for _ in range(chunks):
        content += CHUNK
    return 0


async def every_chunk(store: SqliteStore, session_id: str, chunks: int) -> int:
    reply = ChatMessage("assistant", "")
    for _ in range(chunks):
        reply.set_content(reply.content + CHUNK)
        await store.save_messages(session_id, [reply])
    return chunks


async def at_intervals(store: SqliteStore, session_id: str, chunks: int, chunk_ms: float,
                       flush_ms: float) -> int:
    reply = ChatMessage("assistant", "")
    writes, last_flush = 0, 0.0
    for index in range(1, chunks + 1):
        reply.set_content(reply.content + CHUNK)
        stream_ms = index * chunk_ms
        if stream_ms - last_flush >= flush_ms:
            await store.save_messages(session_id, [reply])
            writes, last_flush = writes + 1, stream_ms
    await store.save_messages(session_id, [reply])  # the final save when the reply ends
    return writes + 1


async def best_of(run: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    best, writes = float("inf"), 0
    for _ in range(REPEATS):
        started = time.perf_counter()
        writes = await run()
        best = min(best, time.perf_counter() - started)
    return best, writes


async def main(chunks: int, chunk_ms: float, flush_ms: float) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(folder)
        await store.create_session("bench", title="bench", route="demo")
        await store.append_messages("bench", [ChatMessage("user", "write me a long answer")])
        base, _ = await best_of(lambda: baseline(chunks))
        each, each_writes = await best_of(lambda: every_chunk(store, "bench", chunks))
        spaced, spaced_writes = await best_of(
            lambda: at_intervals(store, "bench", chunks, chunk_ms, flush_ms))
        await store.close()
    per = {name: seconds / chunks * 1e6 for name, seconds in
           (("baseline", base), ("every", each), ("interval", spaced))}
    print(f"reply: {chunks} chunks of {len(CHUNK)} bytes, one every {chunk_ms:g} ms of stream time")
    print(f"baseline (string append)     {per['baseline']:10.3f} us/chunk")
    print(f"save on every chunk          {per['every']:10.3f} us/chunk  ({each_writes} writes)")
    print(f"save every {flush_ms:g} ms           {per['interval']:10.3f} us/chunk  ({spaced_writes} writes)")
    print(f"every chunk / interval       {per['every'] / per['interval']:10.1f} x")
    print(f"every chunk / baseline       {per['every'] / per['baseline']:10.1f} x")
    print(f"interval / baseline          {per['interval'] / per['baseline']:10.1f} x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--chunk-ms", type=float, default=20.0)
    parser.add_argument("--flush-ms", type=float, default=250.0)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    args = parser.parse_args()
    anyio.run(main, 500 if args.quick else args.chunks, args.chunk_ms, args.flush_ms)
