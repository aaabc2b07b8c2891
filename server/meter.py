"""The context meter: one ``context`` frame body for the route that serves (or will serve) a call.

Capacity and budget are resolved together for that route through the one ``RouteResolver``. Before
a call the numerator is the estimate of what would be sent (messages, images, tool schemas),
calibrated for the route from the provider's earlier reports; after a call it is the provider's
reported input. ``model_context_window`` is left out when the capacity is unknown: the 32,000
compatibility fallback is never presented as a model's window.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.calibration import Calibrations
from server.ledger import HistoryLedger
from server.protocol import server_frame
from server.providers.base import ToolSpec
from server.routing import Capacity, Route, RouteResolver


def tool_schema_tokens(tools: Sequence[ToolSpec]) -> int:
    if not tools:
        return 0
    size = len(json.dumps([[t.name, t.description, t.parameters] for t in tools]).encode("utf-8"))
    return -(-size // 4)


@dataclass(frozen=True)
class Reading:
    route: Route
    capacity: Capacity
    budget: int
    estimate: int  # raw estimate of the request, tools included

    def over_capacity(self) -> int:
        """Tokens by which the request exceeds the known window (0 when it fits or is unknown)."""
        if self.capacity.window is None:
            return 0
        return max(0, self.estimate - self.capacity.window)


async def read_meter(resolver: RouteResolver, route: Route, estimate: int,
                     tools: Sequence[ToolSpec]) -> Reading:
    """Capacity and budget of ``route`` with the estimate of what would be sent to it."""
    capacity = await resolver.capacity(route)
    return Reading(route, capacity, resolver.budget(capacity), estimate + tool_schema_tokens(tools))


async def read_history(resolver: RouteResolver, route: Route, ledger: HistoryLedger,
                       tools: Sequence[ToolSpec]) -> Reading:
    return await read_meter(resolver, route, ledger.estimate, tools)


def context_body(reading: Reading, ledger: HistoryLedger, reason: str, *, calibrations: Calibrations,
                 reported: int | None = None) -> dict[str, Any]:
    preview = None
    if reading.budget > 0 and reported is None:
        turns, tokens = ledger.preview(reading.budget)
        if turns:
            preview = {"turns": turns, "tokens": tokens}
    if reported is None:
        tokens_used, source = calibrations.apply(reading.route, reading.estimate), "estimate"
    else:
        tokens_used, source = reported, "provider"
    return server_frame(
        "context", provider=reading.route.provider, model=reading.route.model,
        route_kind=reading.route.kind, estimated_tokens=tokens_used, tokens_source=source,
        context_token_budget=reading.budget, model_context_window=reading.capacity.window,
        window_source=reading.capacity.source, trim_preview=preview, reason=reason,
    )
