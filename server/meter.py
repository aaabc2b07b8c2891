"""The context meter: one ``context`` frame body for the route that serves (or will serve) a call.

Capacity and budget are resolved together for that route through the one ``RouteResolver``. Before
a call the numerator is the estimate of what would be sent (messages, images, tool schemas),
calibrated for the route from the provider's earlier reports; after a call it is the provider's
reported input. ``model_context_window`` is left out when the capacity is unknown: the 32,000
compatibility fallback is never presented as a model's window.

Two operations: ``Meter.read`` (a ``Reading``: capacity, budget, estimate) and ``Meter.frame`` (the
``context`` frame for a reading). ``Session.emit_meter`` does both and sends the frame.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from server.config import ProviderProfile
from server.ledger import HistoryLedger
from server.protocol import server_frame
from server.providers.base import ToolSpec
from server.routing import Capacity, Route, RouteResolver
from server.tools import tool_specs


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


class Meter:
    def __init__(self, resolver: RouteResolver, providers: Mapping[str, ProviderProfile]) -> None:
        self.resolver = resolver
        self._providers = providers

    def tools(self, route: Route, final: bool = False) -> list[ToolSpec]:
        """The tools offered on ``route``'s calls: none on the final call after the tool cap."""
        return [] if final or not self._providers[route.provider].tools else tool_specs()

    async def read(self, route: Route, estimate: int, tools: Sequence[ToolSpec]) -> Reading:
        """Capacity and budget of ``route`` with the estimate of what would be sent to it."""
        capacity = await self.resolver.capacity(route)
        return Reading(route, capacity, self.resolver.budget(capacity), estimate + tool_schema_tokens(tools))

    def frame(self, reading: Reading, ledger: HistoryLedger, reason: str,
              reported: int | None = None) -> dict[str, Any]:
        preview = None
        if reading.budget > 0 and reported is None:
            turns, tokens = ledger.preview(reading.budget)
            if turns:
                preview = {"turns": turns, "tokens": tokens}
        if reported is None:
            tokens_used, source = self.resolver.calibration.apply(reading.route, reading.estimate), "estimate"
        else:
            tokens_used, source = reported, "provider"
        return server_frame(
            "context", provider=reading.route.provider, model=reading.route.model,
            route_kind=reading.route.kind, estimated_tokens=tokens_used, tokens_source=source,
            context_token_budget=reading.budget, model_context_window=reading.capacity.window,
            window_source=reading.capacity.source, trim_preview=preview, reason=reason,
        )
