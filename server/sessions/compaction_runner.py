"""Group compaction in the turn loop (``[runtime.compaction]``), around the planner in
``server.history.compaction``.

Runs before each provider call, after the turn limit and before the token-budget trim. Truncation
marks the oldest groups excluded. Summarization asks the turn's own route for a summary of what is
excluded (no tools), inserts it where the excluded groups began and stores it; when that call fails
the plan is rolled back and the turn goes on uncompacted (the token-budget trim still applies).
Either way a ``history_trimmed`` frame with reason ``compaction`` tells the user.
"""

from __future__ import annotations

import logging
from typing import Protocol

from server.config.settings import CompactionSettings, RuntimeSettings
from server.errors import MeterchatError
from server.history.compaction import (
    CompactionPlan,
    apply_summary,
    apply_truncation,
    plan_compaction,
    rollback,
    summary_request,
)
from server.history.messages import is_turn_start
from server.protocol import server_frame
from server.providers.base import Provider, ProviderRequest, TextDelta
from server.routing.meter import Reading
from server.routing.resolver import Route
from server.sessions.session import Session, dropped_ids

log = logging.getLogger(__name__)


class Compaction(Protocol):
    async def compact(self, session: Session, route: Route, provider: Provider, turn_id: str) -> None: ...


class NoCompaction:
    async def compact(self, session: Session, route: Route, provider: Provider, turn_id: str) -> None:
        return None


def compaction_for(options: RuntimeSettings) -> Compaction:
    if options.compaction.strategy == "none":
        return NoCompaction()
    return Compactor(options.compaction, options.max_output_tokens)


class Compactor:
    def __init__(self, settings: CompactionSettings, max_output_tokens: int) -> None:
        self.settings = settings
        self.max_output_tokens = max_output_tokens

    async def compact(self, session: Session, route: Route, provider: Provider, turn_id: str) -> None:
        plan = plan_compaction(session.to_send(), self.settings, image_token_cost=session.image_token_cost)
        if not plan.needed:
            return
        before = await session.read_meter(route)  # the figure the meter showed, in its accounting
        if plan.strategy == "summarization":
            if not await self.summarize(session, route, provider, plan):
                return
        else:
            apply_truncation(plan)
        session.rebuild()
        await session.store.save_messages(session.id, plan.excluded_messages)
        await self.announce(session, route, plan, turn_id, before)

    async def summarize(self, session: Session, route: Route, provider: Provider,
                        plan: CompactionPlan) -> bool:
        request = ProviderRequest(route.model, summary_request(plan), (), self.max_output_tokens)
        session.flush_frames()  # the turn's frames so far go out now, not after a summary's seconds
        try:
            parts = [event.text async for event in provider.stream(request) if isinstance(event, TextDelta)]
        except MeterchatError as exc:
            log.warning("summarization on %s failed (%s); continuing without compaction",
                        route.name, exc.message)
            rollback(plan)
            return False
        summary = apply_summary(session.transcript, plan, "".join(parts))
        index = session.transcript.index(summary)
        await session.store.insert_message(session.id, index, summary)
        return True

    async def announce(self, session: Session, route: Route, plan: CompactionPlan, turn_id: str,
                       before: Reading) -> None:
        """The notice's figures are the meter's (tools, calibration, reserve; a summary counted),
        so they read as the meter did before and does after; the target, set in raw tokens, is
        converted into the same accounting."""
        excluded = plan.excluded_messages
        kept = session.to_send()
        after = await session.read_meter(route)
        frame = session.emit(server_frame(
            "history_trimmed", dropped_messages=len(excluded),
            dropped_turns=sum(1 for m in excluded if is_turn_start(m)),
            kept_turns=sum(1 for m in kept if is_turn_start(m)), reason="compaction",
            token_budget=before.history_figure(plan.target), tokens_before=before.figure,
            tokens_after=after.figure, **dropped_ids(excluded), turn_id=turn_id))
        await session.keep_trim(frame)  # a reload puts the notice back where it happened
        await session.emit_meter(route, "trim", after)
