"""Per-turn cost of the history engine against history length: ``python bench/history.py [--quick]``.

Each round does what a session does every turn: append a new turn (user, assistant tool call, tool
result, assistant answer), estimate, trim to the budget. The budget is the starting estimate, so
every round drops about one old turn and the history stays at its length. Three paths:

- baseline: append four messages to a list and add their cached token figures (the bare floor);
- ledger:   ``HistoryLedger.append`` + ``estimate`` + ``trim`` (what the session should use);
- naive:    list append + ``estimate_history_tokens`` + ``trim_to_recent_turns`` over the whole list.

Figures are printed, never asserted. ``--quick`` runs small sizes and few rounds (about a second),
to check the bench still runs, not to measure.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.history.ledger import HistoryLedger  # noqa: E402
from server.history.messages import ChatMessage, ToolCall, estimate_history_tokens  # noqa: E402
from server.history.trim import trim_to_recent_turns  # noqa: E402

SIZES = (100, 1_000, 10_000)


def make_turn(n: int) -> list[ChatMessage]:
    call = ToolCall(f"call-{n}", "search", {"query": f"topic {n}"})
    return [
        ChatMessage("user", f"question {n}: what about the topic number {n}?"),
        ChatMessage("assistant", "", tool_calls=[call]),
        ChatMessage("tool", f"result {n} " + "lorem ipsum " * 20, tool_call_id=call.id, name="search"),
        ChatMessage("assistant", f"answer {n}: " + "dolor sit amet " * 8),
    ]


def make_history(turns: int) -> list[ChatMessage]:
    rows = [ChatMessage("system", "You are a helpful assistant.")]
    for n in range(turns):
        rows += make_turn(n)
    return rows


def timed(rounds: int, step: Callable[[int], None]) -> float:
    """Microseconds per call of ``step``; new turns are built before the clock starts."""
    start = time.perf_counter()
    for index in range(rounds):
        step(index)
    return (time.perf_counter() - start) / rounds * 1e6


def bench_baseline(turns: int, rounds: int) -> float:
    rows = make_history(turns)
    fresh = [make_turn(turns + i) for i in range(rounds)]
    for batch in fresh:
        for message in batch:
            _ = message.text_tokens  # the baseline only adds cached figures
    total = [0]

    def step(index: int) -> None:
        for message in fresh[index]:
            rows.append(message)
            total[0] += message.text_tokens

    return timed(rounds, step)


def bench_ledger(turns: int, rounds: int) -> float:
    ledger = HistoryLedger(make_history(turns))
    budget = ledger.estimate
    fresh = [make_turn(turns + i) for i in range(rounds)]

    def step(index: int) -> None:
        ledger.extend(fresh[index])
        _ = ledger.estimate
        ledger.trim(budget)

    return timed(rounds, step)


def bench_naive(turns: int, rounds: int) -> float:
    rows = make_history(turns)
    budget = estimate_history_tokens(rows)
    fresh = [make_turn(turns + i) for i in range(rounds)]

    def step(index: int) -> None:
        nonlocal rows
        rows.extend(fresh[index])
        estimate_history_tokens(rows)
        rows = trim_to_recent_turns(rows, budget).messages

    return timed(rounds, step)


def main(quick: bool = False) -> None:
    sizes, scale = (SIZES[:2], 20) if quick else (SIZES, 1)
    print(f"{'turns':>7} {'baseline us':>12} {'ledger us':>10} {'x baseline':>11} {'x 100-turn':>11}"
          f" {'naive us':>10} {'naive x ledger':>15}")
    first: float | None = None
    for turns in sizes:
        baseline = bench_baseline(turns, 20_000 // scale)
        ledger = bench_ledger(turns, 5_000 // scale)
        naive = bench_naive(turns, max(20, 200_000 // (turns * 4)) // scale)
        first = first or ledger
        print(f"{turns:>7} {baseline:>12.2f} {ledger:>10.2f} {ledger / baseline:>11.1f}"
              f" {ledger / first:>11.2f} {naive:>10.1f} {naive / ledger:>15.0f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
