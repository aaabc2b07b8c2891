"""Group compaction in the turn loop (``[runtime.compaction]``), around the pure planner in
``server.compaction``.

Runs before each provider call, after the turn limit and before the token-budget trim. Truncation
marks the oldest groups excluded. Summarization asks the turn's own route for a summary of what is
excluded (no tools), inserts it where the excluded groups began and stores it; when that call fails
the plan is rolled back and the turn goes on uncompacted (the token-budget trim still applies).
Either way a ``history_trimmed`` frame with reason ``compaction`` tells the user.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from server.compaction import (
    CompactionPlan,
    apply_summary,
    apply_truncation,
    plan_compaction,
    rollback,
    summary_request,
)
from server.config import CompactionSettings
from server.errors import MeterchatError
from server.history import is_turn_start
from server.live import dropped_ids
from server.providers.base import ProviderRequest, TextDelta

if TYPE_CHECKING:
    from server.session import Turn

log = logging.getLogger(__name__)


class Compactor:
    def __init__(self, settings: CompactionSettings) -> None:
        self.settings = settings

    async def compact(self, turn: Turn) -> None:
        live = turn.live
        plan = plan_compaction(live.view(), self.settings, image_token_cost=turn.runtime.image_token_cost)
        if not plan.needed:
            return
        if plan.strategy == "summarization":
            if not await self.summarize(turn, plan):
                return
        else:
            apply_truncation(plan)
        live.rebuild()
        await turn.rt.store.save_messages(live.id, plan.excluded_messages)
        await self.announce(turn, plan)

    async def summarize(self, turn: Turn, plan: CompactionPlan) -> bool:
        provider = turn.rt.providers[turn.route.provider]
        request = ProviderRequest(turn.route.model, summary_request(plan), (),
                                  turn.runtime.max_output_tokens)
        try:
            parts = [event.text async for event in provider.stream(request) if isinstance(event, TextDelta)]
        except MeterchatError as exc:
            log.warning("summarization on %s failed (%s); continuing without compaction",
                        turn.route.name, exc.message)
            rollback(plan)
            return False
        summary = apply_summary(turn.live.transcript, plan, "".join(parts))
        index = turn.live.transcript.index(summary)
        await turn.rt.store.insert_message(turn.live.id, index, summary)
        return True

    async def announce(self, turn: Turn, plan: CompactionPlan) -> None:
        excluded = plan.excluded_messages
        view = turn.live.view()
        turn.emit("history_trimmed", dropped_messages=len(excluded),
                  dropped_turns=sum(1 for m in excluded if is_turn_start(m)),
                  kept_turns=sum(1 for m in view if is_turn_start(m)), reason="compaction",
                  token_budget=plan.target, tokens_before=plan.tokens_before, tokens_after=plan.tokens_after,
                  **dropped_ids(excluded), turn_id=turn.turn_id)
        await turn.emit_context("trim")
