"""``Counts``: the provider's exact count of a session's next request, asked between turns.

When a session is opened, switched, or a turn ends, and its route's provider has a count endpoint
(``count_endpoint = "auto"``; ``server/providers/counts.py``), the whole request the session would
send now (history and tool schemas, counted in one call: counting tool by tool over-counts the
shared preamble) is counted in the background. Contract:

- Off the hot path: a count never delays a send or a frame; it runs in the app's task group.
- Debounced: one count per session at a time; requests that come while one runs make one more run
  after it (of the history as it is then), never a queue.
- Time-bounded: the provider's answer within ``COUNT_SECONDS`` (the provider bounds each call; this
  bounds the whole), else nothing.
- Stale answers are dropped: a count is used only if, when it comes, no turn is running and the
  session's route and estimate are what was counted.
- A window named in the same answer (vLLM's ``max_model_len``, llama.cpp's ``n_ctx``) is the route's
  discovered window (``window_source: "provider"``) where ``discover_window`` is on.
- A count becomes the route's anchor (``Anchor(raw, count, source="provider_count")``, keeping the
  ratios learned) and a ``context`` frame (``reason: "count"``) whose ``tokens_source`` says
  ``provider_count``. The next send is then that count plus the new message's estimate.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from server.history.messages import estimate_history_tokens
from server.history.trim import sweep_orphans
from server.providers.base import ProviderRequest, TokenCount
from server.routing.anchor import count_anchor
from server.routing.resolver import Route
from server.sessions.runtime import Runtime

if TYPE_CHECKING:
    from server.sessions.session import Session

log = logging.getLogger(__name__)

COUNT_SECONDS = 10.0  # the whole count (a probe may make three calls, each bounded by 5 s)
COUNTING_KINDS = ("openai", "anthropic")  # the dialects with count endpoints
REASON = "count"


def counts(rt: Runtime, route: Route) -> bool:
    profile = rt.settings.providers.get(route.provider)
    return profile is not None and profile.count_endpoint != "off" and profile.kind in COUNTING_KINDS


class Counts:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._running: set[str] = set()  # session ids with a count under way
        self._again: set[str] = set()  # ... and asked for again since it began

    def request(self, session: Session) -> None:
        """Count ``session``'s next request soon, unless its provider has no count endpoint."""
        if not counts(self.rt, session.route):
            return
        if session.id in self._running:
            self._again.add(session.id)
            return
        self._running.add(session.id)
        self.rt.task_group.start_soon(self._counts, session)

    async def _counts(self, session: Session) -> None:
        try:
            while True:
                self._again.discard(session.id)
                await self.count_once(session)
                if session.id not in self._again:
                    return
        except Exception:  # a count is a nicety: it never takes anything down
            log.exception("counting the next request of session %s failed", session.id)
        finally:
            self._running.discard(session.id)
            self._again.discard(session.id)

    async def count_once(self, session: Session) -> bool:
        """Ask for the count of what ``session`` would send now; True when it was used."""
        if session.busy:
            return False  # the turn's own usage will count it
        route = session.route
        before = await session.read_meter(route)
        # What a turn would send: swept as Turn.prepare sweeps (a repeated call id's result is not
        # sent, so it must not be counted either).
        messages = sweep_orphans(session.to_send())
        tools = self.rt.meter.tools(route)
        request = ProviderRequest(route.model, messages, tools, self.rt.options.max_output_tokens)
        counted: TokenCount | None = None
        with anyio.move_on_after(COUNT_SECONDS):
            counted = await self.rt.providers[route.provider].count_tokens(request)
        if counted is None:
            return False
        if counted.window:  # the same answer named the window (used where discovery is on)
            self.rt.resolver.discovered(route, counted.window)
        if session.busy or session.route != route:
            return False
        reading = await session.read_meter(route)
        if reading.estimate != before.estimate:
            return False  # the history changed while it was counted
        raw = (await self.rt.meter.read(route, estimate_history_tokens(messages, session.image_token_cost),
                                        tools)).estimate
        anchors = session.anchors
        conversation = any(message.role != "system" for message in messages)
        if not conversation:
            self.rt.meter.opened(route.name, raw, counted.tokens)
        anchors[route.name] = count_anchor(anchors.get(route.name), raw, counted.tokens, conversation)
        await session.emit_meter(route, REASON)
        return True
