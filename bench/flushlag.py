"""Does saving streaming replies delay the chunks? The event loop's lateness under 100 paced replies,
with their checkpoints through the ``Flusher``, with one save per reply awaited by its turn, and with
no checkpoint at all, in one process and one run.

    python bench/flushlag.py [--sessions 100] [--seconds 6] [--token-bytes 5] [--rounds 2] [--quick]

Each session is a task that wakes every 20 ms (50 tokens/s), appends a token to its ``ReplyWriter``
and does what a turn does when the writer says the reply is due (every ``store_flush_ms``, 250 ms):
``flusher`` hands it to the real ``Flusher`` (one ``save_batch`` per 50 ms tick, what main does),
``per-reply`` awaits ``save_messages`` itself (what a turn did before the flusher), ``none`` never
saves (the floor). Lateness is how long after its 20 ms mark a session woke: the delay a chunk
arriving then would have waited for the loop. The real SQLite store in a temporary folder; modes
alternate within each round, so the machine's load falls on all of them alike. Prints lateness
p50/p99 and the process CPU per token. Nothing is asserted. ``--quick``: 10 sessions for 0.6 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.sessions.flusher import Flusher  # noqa: E402
from server.sessions.reply import ReplyWriter, Step  # noqa: E402
from server.store.backends import open_store  # noqa: E402
from server.store.base import Store  # noqa: E402

PACE = 0.02
FLUSH_SECONDS = 0.25
MODES = ("flusher", "per-reply", "none")


async def session(store: Store, flusher: Flusher, sid: str, mode: str, seconds: float, token: str,
                  late: list[float]) -> None:
    writer = ReplyWriter(f"t-{sid}", FLUSH_SECONDS if mode != "none" else float("inf"))
    start = time.monotonic()
    for n in range(1, int(seconds / PACE) + 1):
        due_at = start + n * PACE
        await anyio.sleep(max(due_at - time.monotonic(), 0))
        late.append(time.monotonic() - due_at)
        step = writer.append(token)
        if step is Step.JOIN and mode != "none":
            message = writer.current()
            assert message is not None
            await store.save_messages(sid, [message])  # a turn stores the reply's start at once
        elif step is Step.FLUSH and mode == "flusher":
            flusher.due(sid, writer.flush())
        elif step is Step.FLUSH:
            await store.save_messages(sid, [writer.flush()])


async def run_mode(store: Store, sessions: int, mode: str, seconds: float, token: str
                   ) -> tuple[list[float], float, int]:
    late: list[float] = []
    cpu_at = time.process_time()
    async with anyio.create_task_group() as tasks:
        flusher = Flusher(store, tasks)
        for n in range(sessions):
            tasks.start_soon(session, store, flusher, f"{mode}-{n}", mode, seconds, token, late)
    return late, time.process_time() - cpu_at, flusher.batches


async def main(sessions: int, seconds: float, token_bytes: int, rounds: int) -> None:
    token = ("w" * max(token_bytes - 1, 1)) + " "
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp))
        for mode in MODES:
            for n in range(sessions):
                await store.create_session(f"{mode}-{n}", title="bench", route="demo/demo-small")
        print(f"{sessions} sessions x {seconds:g} s at 50 tokens/s, {len(token)}-byte tokens, checkpoint "
              f"every {FLUSH_SECONDS * 1000:g} ms, the real SQLite store; lateness of each 20 ms wake-up")
        for round_ in range(1, rounds + 1):
            for mode in MODES:
                late, cpu, batches = await run_mode(store, sessions, mode, seconds, token)
                ms = sorted(x * 1000 for x in late)
                print(f"round {round_}  {mode:<10} lateness p50 {statistics.median(ms):6.2f} ms  "
                      f"p99 {ms[int(len(ms) * 0.99) - 1]:7.2f} ms   CPU {cpu / len(late) * 1e6:6.1f} us "
                      f"per token   batches {batches}")
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--token-bytes", type=int, default=5, help="5 is a word; bench/load.py's are 30")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    args = parser.parse_args()
    if args.quick:
        anyio.run(main, 10, 0.6, 5, 1)
    else:
        anyio.run(main, args.sessions, args.seconds, args.token_bytes, args.rounds)
