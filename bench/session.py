"""Per-turn cost of the session's own history path against the length of the transcript:
``python bench/session.py [--quick]``.

Each round does what ``server.sessions.turn.Turn`` does around one provider call: add the user message,
apply the turn limit and the token budget through the session's ``HistoryLedger`` (and the running
sum of what trims left out), read the meter (estimate, trim preview and the context frame's parts),
assemble the request (``to_send`` + orphan sweep + estimate of what is sent), then add the reply.
Two series:

- bounded: the default turn limit (50) keeps what is sent bounded, so the transcript grows (100 to
  10,000 turns, most of them trimmed) while the work should stay flat;
- all sent: the turn limit equals the history and trimming is off, so every turn is sent: the work
  grows with what is sent (assembling a request is linear in it), shown for honesty.

The baseline, measured in the same run, is appending the two messages to a list. Printed, never
asserted. ``--quick`` runs the two smaller sizes with few rounds (about a second), to check the
bench still runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.history.messages import TRIMMED, ChatMessage, estimate_history_tokens, left_out_tokens  # noqa: E402
from server.history.trim import sweep_orphans  # noqa: E402
from server.routing.meter import Reading, breakdown  # noqa: E402
from server.routing.resolver import Capacity, Route  # noqa: E402
from server.sessions.channel import FrameChannel  # noqa: E402
from server.sessions.events import EventBus  # noqa: E402
from server.sessions.session import Session  # noqa: E402

SIZES = (100, 1_000, 10_000)
ROUNDS = 200
ROUTE = Route("demo", "demo-small", "default")
CAPACITY = Capacity(None)


def turn(n: int) -> tuple[ChatMessage, ChatMessage]:
    return (ChatMessage("user", f"question {n}: " + "words " * 30, turn_id=str(n)),
            ChatMessage("assistant", f"answer {n}: " + "reply " * 60, turn_id=str(n)))


def session_of(turns: int, limit: int) -> Session:
    live = Session("bench", "bench", ROUTE, [], channel=FrameChannel("bench", EventBus()))
    for n in range(turns):
        live.add(*turn(n))
        for message in live.ledger.trim_turn_count(limit or turns + 1).dropped:
            message.left_out = TRIMMED
    return live


def one_turn(live: Session, n: int, limit: int, budget: int) -> None:
    user, reply = turn(n)
    live.add(user)
    for report in (live.ledger.trim_turn_count(limit), live.ledger.trim(budget)):
        for message in report.dropped:
            message.left_out = TRIMMED
        live.trimmed_tokens += left_out_tokens(report.dropped)
    live.ledger.preview(budget)
    breakdown(Reading(ROUTE, CAPACITY, budget, live.ledger.estimate), live.ledger, live.trimmed_tokens)
    request = sweep_orphans(live.to_send())
    estimate_history_tokens(request)
    live.add(reply)


def per_turn_us(turns: int, limit: int, budget: int, rounds: int = ROUNDS) -> float:
    """Best of three runs of ``rounds`` turns each, on a session that already has ``turns`` turns."""
    best = float("inf")
    for _ in range(3):
        live = session_of(turns, limit)
        start = time.perf_counter()
        for n in range(turns, turns + rounds):
            one_turn(live, n, limit if limit else n + 1, budget)
        best = min(best, (time.perf_counter() - start) / rounds * 1e6)
    return best


def baseline_us() -> float:
    items: list[ChatMessage] = []
    pairs = [turn(n) for n in range(ROUNDS)]
    start = time.perf_counter()
    for user, reply in pairs:
        items.append(user)
        items.append(reply)
    return (time.perf_counter() - start) / ROUNDS * 1e6


def main(quick: bool = False) -> None:
    sizes, rounds = (SIZES[:2], 20) if quick else (SIZES, ROUNDS)
    base = baseline_us()
    print(f"baseline (append two messages): {base:.2f} us per turn")
    print(f"{'series':<10} {'transcript turns':>16} {'us per turn':>12} {'x baseline':>11} {'x first':>8}")
    for name, limit, budget in (("bounded", 50, 32_000), ("all sent", 0, 0)):
        first = None
        for size in sizes:
            us = per_turn_us(size, limit, budget, rounds)
            first = first or us
            print(f"{name:<10} {size:>16,} {us:>12.1f} {us / base:>11.0f} {us / first:>8.2f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
