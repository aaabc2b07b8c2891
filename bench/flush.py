"""CPU per streaming reply flushed to the store: one save per session against one batch per tick.

    python bench/flush.py [--sessions 100] [--rounds 10] [--quick]

The real SQLite store in a temporary folder; each of ``--sessions`` sessions holds a 2 KB streaming
reply that is flushed ``--rounds`` times, first with one ``save_messages`` call per session (what a
turn did before the flusher), then with one ``save_batch`` per round (what ``Flusher`` does). Prints
CPU and wall time per reply flushed, each way twice, in the same run. Nothing is asserted.
``--quick`` runs 10 sessions x 2 rounds (well under a second), to check the bench still runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.history.messages import ChatMessage  # noqa: E402
from server.store.backends import open_store  # noqa: E402
from server.store.sqlite import SqliteStore  # noqa: E402


async def flush_round(store: SqliteStore, replies: dict[str, ChatMessage], batched: bool) -> None:
    if batched:
        await store.save_batch({sid: [reply] for sid, reply in replies.items()})
        return
    for sid, reply in replies.items():
        await store.save_messages(sid, [reply])


async def main(sessions: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        replies = {f"s{n}": ChatMessage("assistant", "word " * 400, turn_id="t", interrupted=True)
                   for n in range(sessions)}
        for sid in replies:
            await store.create_session(sid, title=sid, route="demo/demo-small")
        print(f"{sessions} sessions x {rounds} rounds, a 2 KB reply each, the real SQLite store")
        for batched in (False, True, False, True):
            cpu_at, wall_at = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                await flush_round(store, replies, batched)
            flushed = sessions * rounds
            cpu = (time.process_time() - cpu_at) / flushed * 1e6
            wall = (time.perf_counter() - wall_at) / flushed * 1e6
            name = "one batch per tick" if batched else "one save per session"
            print(f"{name:<22} CPU {cpu:6.0f} us per reply flushed   wall {wall:6.0f} us")
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    args = parser.parse_args()
    anyio.run(main, *((10, 2) if args.quick else (args.sessions, args.rounds)))
