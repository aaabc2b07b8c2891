"""What many replies ending (and turns starting) together cost the server, part by part, each
against its baseline in the same run.

    python bench/reply_end.py [--sessions 500] [--quick]

- The meter's reading of each finished reply (``content.piece_density``): counting by character
  classes (``_counted``) against matching its definition's regular expressions (``_matched``), per
  4,096 characters of each kind of text.
- The provider pool's pass on each new request (``providers/pool.FastPool``, idle connections
  indexed) against httpcore's own pass over the same connections: ``--sessions`` turns starting
  together, and one request among that many streams with 20 idle connections.
- The store's calls that come together on one SQLite file (``store/group.py``): ``--sessions``
  sessions created, then their replies' final writes, each call with its own thread hop (as
  ``SqliteStore._call`` made them before ``CallQueue``) against one hop for the calls queued while
  one is on its way, each in its own transaction, and for the final writes also grouped into one
  transaction (``save_messages`` now).

Prints microseconds and ratios; asserts nothing. Best of three for the first two parts; the writes
are CPU time of the whole process (the store's thread included). ``--quick``: 50 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import httpcore
from httpcore._async.connection_pool import AsyncPoolRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.history.messages import ChatMessage  # noqa: E402
from server.providers.h1 import H1Connection, _State  # noqa: E402
from server.providers.pool import FastPool  # noqa: E402
from server.routing.content import SAMPLE_CHARS, _counted, _matched  # noqa: E402
from server.store.sqlite import SqliteStore, _row  # noqa: E402

BENCH_REPLY = "".join(f"~s{n}:{1733200000000000000 + n * 20000000}~ " for n in range(500))  # load.py's
TEXTS = {
    "load bench reply": BENCH_REPLY,
    "prose": "The meter shows how full the next request is before it is sent, and what a trim leaves. " * 60,
    "prose, dashes and curly quotes": "The meter \u2014 before it\u2019s sent \u2014 shows a trim. " * 80,
    "prose, accented": "Le m\u00e8tre montre \u00e0 l\u2019avance ce qu\u2019une coupe laisse. " * 70,
    "JSON": json.dumps([{"id": n, "name": f"record-{n}", "score": n / 7, "ok": n % 2} for n in range(90)]),
    "code": "\n".join(f"def step_{n}(values: list[int]) -> int:\n    return sum(v * {n} for v in values)"
                      for n in range(60)),
    "CJK": "\u4e0a\u4e0b\u6587\u7a97\u53e3\u9884\u7b97\u4ee4\u724c\u4f30\u8ba1\u3002" * 300,
}
URL = "http://127.0.0.1:9/v1/chat/completions"


def best(run: Callable[[], object], number: int) -> float:
    """Microseconds a call, the best of three."""
    return min(timeit.repeat(run, number=number, repeat=3)) / number * 1e6


def pieces() -> None:
    print("| text (first 4,096 characters) | matching, us | by classes, us | matching / classes |")
    print("|---|---|---|---|")
    for kind, text in TEXTS.items():
        sample = text[:SAMPLE_CHARS]
        assert _counted(sample) == _matched(sample), kind
        matched, counted = best(partial(_matched, sample), 50), best(partial(_counted, sample), 50)
        print(f"| {kind} | {matched:.0f} | {counted:.0f} | {matched / counted:.1f}x |")


class StockPool(httpcore.AsyncConnectionPool):
    """httpcore's own pass over the same connections."""

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        return H1Connection(origin, self._ssl_context, self._keepalive_expiry, self._socket_options)


def went_idle(connection: httpcore.AsyncConnectionInterface) -> None:
    """What a response closing on a kept connection does (``H1Connection.response_closed``)."""
    assert isinstance(connection, H1Connection)
    connection._state, connection.idle_since = _State.IDLE, time.monotonic()
    if connection._on_idle is not None:
        connection._on_idle(connection)


async def passes(pool: httpcore.AsyncConnectionPool, sessions: int) -> tuple[float, float]:
    """Microseconds of pass per request: ``sessions`` turns starting one after another, then
    requests among ``sessions`` streams with 20 idle connections."""
    started = time.perf_counter()
    for _ in range(sessions):
        request = AsyncPoolRequest(httpcore.Request("POST", URL))
        pool._requests.append(request)
        pool._assign_requests_to_connections()
        assert isinstance(request.connection, H1Connection)
        request.connection._state = _State.ACTIVE
    starting = (time.perf_counter() - started) / sessions * 1e6
    for _ in range(20):
        request_and_return(pool)
    rounds, started = 200, time.perf_counter()
    for _ in range(rounds):
        request_and_return(pool)
    return starting, (time.perf_counter() - started) / rounds * 1e6


def request_and_return(pool: httpcore.AsyncConnectionPool) -> None:
    """A request's pass, then its response closing on a kept connection (the close's own pass aside)."""
    request = AsyncPoolRequest(httpcore.Request("POST", URL))
    pool._requests.append(request)
    pool._assign_requests_to_connections()
    pool._requests.remove(request)
    assert request.connection is not None
    went_idle(request.connection)


async def pools(sessions: int) -> None:
    figures = {}
    for name, kind in (("httpcore's pass", StockPool), ("FastPool", FastPool)):
        runs = [await passes(kind(max_connections=100_000, max_keepalive_connections=100_000),
                             sessions) for _ in range(3)]
        figures[name] = (min(run[0] for run in runs), min(run[1] for run in runs))
    stock, fast = figures["httpcore's pass"], figures["FastPool"]
    print(f"\n| pool pass, {sessions} streams | httpcore's, us | FastPool, us | httpcore's / FastPool |")
    print("|---|---|---|---|")
    for n, case in enumerate(("a turn starting among those starting", "a request, 20 connections idle")):
        print(f"| {case} | {stock[n]:.1f} | {fast[n]:.1f} | {stock[n] / fast[n]:.1f}x |")


async def hop_each(store: SqliteStore, fn: Callable[..., object], *args: object) -> None:
    """A store call as ``SqliteStore._call`` made it before ``CallQueue``: its own thread hop, the
    store's lock taken on the worker thread."""
    def locked() -> None:
        with store._lock:
            fn(*args)
    await anyio.to_thread.run_sync(locked)


WAYS = {
    "a hop each": lambda store, write: hop_each(store, store._write, write),
    "a transaction each": lambda store, write: store._call(store._write, write),
    "grouped": lambda store, write: store.calls.write(write),
}


async def finals(sessions: int) -> None:
    """Sessions created together, then their final writes together, each way in a fresh file; CPU
    per call of the whole process."""
    rows_for = {kind: [_row(ChatMessage("user", "a question")), _row(ChatMessage("assistant", text))]
                for kind, text in (("load bench reply", BENCH_REPLY), ("prose", TEXTS["prose"] * 3))}
    print(f"\n| {sessions} calls at once, us CPU a call | a hop and a transaction each (before) | "
          "one hop a batch, a transaction each | one hop a batch, one transaction | before / now |")
    print("|---|---|---|---|---|")
    created: dict[str, float] = {}
    for kind, rows in rows_for.items():
        spent: dict[str, float] = {}
        for way, call in WAYS.items():
            with tempfile.TemporaryDirectory() as folder:
                store = SqliteStore.open(folder)
                ids = [f"s{n}" for n in range(sessions)]
                started = time.process_time()
                create_way = WAYS["a hop each" if way == "a hop each" else "a transaction each"]
                async with anyio.create_task_group() as group:
                    for session_id in ids:
                        group.start_soon(create_way, store,
                                         partial(store._create, session_id, "t", "p/m", None, None))
                if kind == "prose":
                    created[way] = (time.process_time() - started) / sessions * 1e6
                started = time.process_time()
                async with anyio.create_task_group() as group:
                    for session_id in ids:
                        group.start_soon(call, store, partial(store._put_final, session_id, rows))
                spent[way] = (time.process_time() - started) / sessions * 1e6
                await store.close()
        before, now = spent["a hop each"], spent["grouped"]
        print(f"| final writes: {kind} | {before:.0f} | {spent['a transaction each']:.0f} | {now:.0f} | "
              f"{before / now:.1f}x |")
    before, now = created["a hop each"], created["a transaction each"]
    print(f"| sessions created | {before:.0f} | {now:.0f} | - | {before / now:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="50 sessions (about a second)")
    args = parser.parse_args()
    sessions = 50 if args.quick else args.sessions
    pieces()
    asyncio.run(pools(sessions))
    asyncio.run(finals(sessions))


if __name__ == "__main__":
    main()
