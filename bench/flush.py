"""CPU per streaming reply flushed to the store: one save per session, and one batch per tick written
as before, against one batch per tick now.

    python bench/flush.py [--sessions 100] [--rounds 10] [--quick]

The real SQLite store in a temporary folder; each of ``--sessions`` sessions holds a question and a
streaming reply that grows by about 60 characters a flush (12 tokens: 250 ms at 50 tokens/s), flushed
``--rounds`` times three ways: one ``save_messages`` call per session (what a turn did before the
flusher); one batch per round, each reply upserted with its session touched and its position found
(what ``save_batch`` did before a checkpoint rewrote its row in place); and ``save_batch`` now. Prints
CPU and wall time per reply flushed, and the store's read and write system calls per reply flushed,
each way twice, in the same run. Nothing is asserted.
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

from server.errors import UnknownSession  # noqa: E402
from server.history.messages import ChatMessage  # noqa: E402
from server.store.sqlite import _UPSERT, Row, SqliteStore, _row  # noqa: E402

GROWTH = "and then the words go on "  # about 60 characters a flush with the round's number


def upserted(store: SqliteStore, work: list[tuple[str, list[Row]]]) -> None:
    """``save_batch``'s transaction before a checkpoint rewrote its row in place."""
    for session_id, rows in work:
        try:
            store._put_rows(session_id, rows, _UPSERT)
        except UnknownSession:
            continue


async def flush_round(store: SqliteStore, replies: dict[str, ChatMessage], way: str) -> None:
    if way == "one save per session":
        for sid, reply in replies.items():
            await store.save_messages(sid, [reply])
    elif way == "batch, upsert + touch":
        await store._call(store._write, upserted, store,
                          [(sid, [_row(reply)]) for sid, reply in replies.items()])
    else:
        await store.save_batch({sid: [reply] for sid, reply in replies.items()})


def syscalls() -> int:
    """This process's read and write system calls so far (Linux ``/proc/self/io``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["syscr"]) + int(fields["syscw"])


async def one_way(way: str, sessions: int, rounds: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore.open(tmp)
        replies = {f"s{n}": ChatMessage("assistant", "", turn_id="t", interrupted=True)
                   for n in range(sessions)}
        for sid in replies:
            await store.create_session(sid, title=sid, route="demo/demo-small")
            await store.save_messages(sid, [ChatMessage("user", "tell me a long story " * 4)])
        cpu_at, wall_at, calls_at = time.process_time(), time.perf_counter(), syscalls()
        for n in range(rounds):
            for reply in replies.values():
                reply.set_content(f"{reply.content}{GROWTH}{n} {n + 1} ")
            await flush_round(store, replies, way)
        flushed = sessions * rounds
        figures = ((time.process_time() - cpu_at) / flushed * 1e6,
                   (time.perf_counter() - wall_at) / flushed * 1e6, (syscalls() - calls_at) / flushed)
        await store.close()
        return figures


async def main(sessions: int, rounds: int) -> None:
    print(f"{sessions} sessions x {rounds} rounds, a reply growing by about 60 characters a round, "
          "the real SQLite store")
    for _ in range(2):
        for way in ("one save per session", "batch, upsert + touch", "one batch per tick (now)"):
            cpu, wall, calls = await one_way(way, sessions, rounds)
            print(f"{way:<26} CPU {cpu:6.1f} us   wall {wall:6.1f} us   read+write syscalls {calls:5.2f}"
                  "   per reply flushed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    args = parser.parse_args()
    anyio.run(main, *((10, 2) if args.quick else (args.sessions, args.rounds)))
