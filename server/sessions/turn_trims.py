"""A turn's trims: before each provider call (the turn limit, compaction, then the budget trim,
measured as the meter measures) and after a provider reports a context overflow (learn what the
error said, trim to fit, or ``HistoryUnfit`` when only the newest turn is left). Every trim is whole
turns, marked and announced through the ``Session``.
"""

from __future__ import annotations

from typing import Protocol

from server.errors import ContextOverflow, HistoryUnfit
from server.history.trim import REASON_OVERFLOW, TrimReport, recovery_budget
from server.routing.calibration import named_window, plausible
from server.routing.meter import Reading
from server.routing.resolver import Route
from server.sessions.compaction_runner import Compaction
from server.sessions.runtime import Runtime
from server.sessions.session import Session


class Turn(Protocol):
    """What the trims read and do of the turn they run in (``server.sessions.turn.Turn``)."""

    rt: Runtime
    session: Session
    route: Route
    turn_id: str
    compaction: Compaction
    sent: Reading | None  # the reading of the request last sent

    async def emit_meter(self, reason: str, reading: Reading | None = None,
                         reported: int | None = None) -> Reading: ...

    def emit(self, kind: str, **fields: object) -> None: ...


async def apply(turn: Turn, report: TrimReport, reading: Reading | None = None,
                budget: int | None = None) -> Reading | None:
    """Mark and announce what ``report`` dropped; the reading of the ``trim`` meter frame (what
    the session would send now), or None when nothing was dropped."""
    if await turn.session.trim(report, turn.turn_id, reading, budget):
        return await turn.emit_meter("trim")
    return None


async def before_call(turn: Turn, final: bool) -> Reading:
    """Turn limit, compaction, then the budget trim, measured as the meter measures: tool
    schemas, calibration, the provider's last count and the reply reserve included. Returns
    the reading of the history left to send (read once: a trim's frame's reading is reused)."""
    session, route = turn.session, turn.route
    ledger = session.ledger
    reading = await apply(turn, ledger.trim_turn_count(turn.rt.options.turn_limit))
    provider = turn.rt.providers[route.provider]
    await turn.compaction.compact(session, route, provider, turn.turn_id)
    if reading is None or final or session.ledger is not ledger:  # compaction rebuilds it
        reading = await session.read_meter(route, final)
    if reading.target > 0:
        report = session.ledger.trim(reading.raw_history_budget())
        trimmed = await apply(turn, report, reading, reading.target)
        if trimmed is not None:
            reading = await session.read_meter(route, final) if final else trimmed
    return reading


async def after_overflow(turn: Turn, overflow: ContextOverflow, final: bool) -> None:
    await learn_from(turn, overflow)
    session = turn.session
    reading = await session.read_meter(turn.route, final)
    raw = recovery_budget(session.ledger.estimate)
    if reading.capacity.window is not None:  # a window the error named: trim to it, not just 2/3
        raw = min(raw, reading.raw_history_budget())
    report = session.ledger.trim(raw, reason=REASON_OVERFLOW)
    if not report.trimmed or not [m for m in report.dropped if not m.breadcrumb]:
        raise HistoryUnfit(f"{turn.route.name} reported a context overflow ({overflow.message}) and "
                           f"no older turn is left to drop: the newest turn alone does not fit")
    await apply(turn, report, reading, reading.history_figure(raw))


async def learn_from(turn: Turn, overflow: ContextOverflow) -> None:
    """An overflow that names the provider's count calibrates; one that names its limit is the
    route's window from now on (kept in the store), so the next turn trims before it sends."""
    rt, route = turn.rt, turn.route
    sent, counted = turn.sent, overflow.requested_tokens or 0
    if sent is not None and plausible(sent.estimate, counted):
        rt.resolver.calibration.observe(route, sent.estimate, counted)
        rt.meter.counted(turn.session.anchors, sent, counted)
    window = named_window(overflow.limit_tokens or 0, turn.rt.options.max_output_tokens)
    if window and await rt.resolver.learn_window(route, window):
        turn.emit("notice", code="window_learned", turn_id=turn.turn_id, message=(
            f"{route.name} refused the request for context length and named its window: "
            f"{window:,} tokens. The meter shows it and meterchat trims to it from now on."))
