"""One turn: route, trim, call, tool loop, recovery, accounting.

Order of a turn (seed 000): the user's message is durable before any provider call; the route for
the call is resolved once (a classifier hint may pick another route for this turn only) and its
capacity and budget drive trimming, the capacity check, the meter and cost alike. Before each
provider call the turn-limit and token-budget trims run on whole turns, the request's estimate is
checked against the route's known window, and a provider's context-overflow error trims to 2/3 of
the estimate and retries (each retry uses an iteration). At ``max_tool_iterations`` one last call
without tools asks for a final answer. A reply that ends early is kept, marked interrupted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from server.errors import CapacityExceeded, ContextOverflow, HistoryUnfit, MeterchatError, error_frame
from server.history import ChatMessage, ToolCall, estimate_history_tokens
from server.history_trim import TrimReport, cap_tool_result, sweep_orphans
from server.live import LiveSession, dropped_ids
from server.meter import Reading, context_body, read_history, read_meter
from server.protocol import server_frame
from server.providers.base import (
    Finish,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from server.routing import Route
from server.runtime import Runtime
from server.store import CallRecord
from server.tools import run_tool, tool_specs

log = logging.getLogger(__name__)

TRUNCATION_RATIO = 0.6  # a prompt count below 60% of the (calibrated) estimate means a cut
TRUNCATION_MIN_TOKENS = 512
FINAL_ANSWER_PROMPT = (
    "[Tool limit reached] Answer the user now from what you have; no more tool calls are possible."
)


def tools_for(rt: Runtime, route: Route, final: bool = False) -> list[ToolSpec]:
    """The tools offered on ``route``'s calls: none on the final call after the tool cap."""
    profile = rt.settings.providers[route.provider]
    return [] if final or not profile.tools else tool_specs()


async def emit_meter(rt: Runtime, live: LiveSession, route: Route, reason: str,
                     reading: Reading | None = None, reported: int | None = None) -> Reading:
    """Send the ``context`` frame for ``route``: what the session would send now, or ``reported``."""
    if reading is None:
        reading = await read_history(rt.resolver, route, live.ledger, tools_for(rt, route))
    live.emit(context_body(reading, live.ledger, reason, calibrations=rt.resolver.calibration,
                           reported=reported))
    return reading


async def record_trim(rt: Runtime, live: LiveSession, report: TrimReport,
                      turn_id: str | None = None) -> bool:
    """Mark what a trim dropped (kept in the transcript, no longer sent), store the marks and tell
    every client and observer with a ``history_trimmed`` frame. False when nothing was dropped."""
    dropped = [m for m in report.dropped if not m.breadcrumb]
    if not dropped:
        return False
    for message in dropped:
        message.trimmed = True
    await rt.store.save_messages(live.id, dropped)
    fields = {**report.frame_fields(), "dropped_messages": len(dropped)}
    live.emit(server_frame("history_trimmed", **fields, **dropped_ids(dropped), turn_id=turn_id))
    return True


async def set_aside_turn(rt: Runtime, live: LiveSession, turn_id: str, reason: str) -> list[ChatMessage]:
    """Keep a turn's messages in the transcript but stop sending them (marked ``excluded`` with
    ``reason``); returns what was set aside (nothing when the turn is unknown or already hidden)."""
    messages = [m for m in live.transcript if m.turn_id == turn_id and not m.is_hidden]
    for message in messages:
        message.excluded = reason
    if messages:
        live.rebuild()
        await rt.store.save_messages(live.id, messages)
    return messages


@dataclass
class CallResult:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish: str | None = None


@dataclass
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    last_input_tokens: int = 0
    cost_usd: float | None = None


class Turn:
    def __init__(self, rt: Runtime, live: LiveSession, turn_id: str, route: Route) -> None:
        self.rt = rt
        self.live = live
        self.turn_id = turn_id
        self.route = route
        self.runtime = rt.settings.runtime
        self.totals = Totals()
        self.reply_parts: list[str] = []
        self.reply: ChatMessage | None = None
        self.reply_listed = False  # the reply is in the transcript (flushed while streaming)
        self.final_text = ""
        self.last_flush = 0.0
        self.flush_interval = rt.settings.server.store_flush_ms / 1000

    # --- frames -------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: object) -> None:
        self.live.emit(server_frame(kind, **fields))

    async def emit_context(self, reason: str, reading: Reading | None = None,
                           reported: int | None = None) -> Reading:
        return await emit_meter(self.rt, self.live, self.route, reason, reading, reported)

    def tools(self, final: bool = False) -> list[ToolSpec]:
        return tools_for(self.rt, self.route, final)

    # --- trimming -----------------------------------------------------------------------------

    async def apply_trim(self, result: TrimReport) -> None:
        if await record_trim(self.rt, self.live, result, self.turn_id):
            await self.emit_context("trim")

    async def proactive_trims(self, budget: int) -> None:
        await self.apply_trim(self.live.ledger.trim_turn_count(self.runtime.turn_limit))
        await self.rt.compactor.compact(self)
        if budget > 0:
            await self.apply_trim(self.live.ledger.trim(budget))

    async def recover(self, overflow: ContextOverflow) -> None:
        result = self.live.ledger.trim_for_overflow()
        if not result.trimmed or not [m for m in result.dropped if not m.breadcrumb]:
            raise HistoryUnfit(f"{self.route.name} reported a context overflow ({overflow.message}) and "
                               f"no older turn is left to drop: the newest turn alone does not fit")
        await self.apply_trim(result)

    async def set_aside(self) -> None:
        """A turn refused before it fits is kept in the transcript but not sent again, so one
        oversized message cannot block every later turn when proactive trimming is off."""
        await set_aside_turn(self.rt, self.live, self.turn_id,
                             "not sent: the request did not fit the model's context window")

    # --- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.loop()
        except CapacityExceeded as exc:
            await self.finish_reply(interrupted=True)
            await self.set_aside()
            self.live.emit(error_frame(exc, turn_id=self.turn_id))
        except MeterchatError as exc:
            await self.finish_reply(interrupted=True)
            self.live.emit(error_frame(exc, turn_id=self.turn_id))
        except Exception as exc:  # a bug must not take the session down; the user is told
            log.exception("turn %s of session %s failed", self.turn_id, self.live.id)
            await self.finish_reply(interrupted=True)
            self.live.emit(error_frame(exc, turn_id=self.turn_id))
        else:
            await self.finish_reply(interrupted=False)
            await self.emit_done()

    async def loop(self) -> None:
        limit = self.runtime.max_tool_iterations
        iteration = 0
        while iteration <= limit:
            final = iteration == limit
            reading = await read_history(self.rt.resolver, self.route, self.live.ledger,
                                         self.tools(final))
            await self.proactive_trims(reading.budget)
            iteration += 1
            try:
                result = await self.call(final)
            except ContextOverflow as overflow:
                await self.recover(overflow)
                if final:  # the final answer is still owed: retry it (each recovery drops a turn)
                    iteration -= 1
                continue
            if not result.tool_calls or final:
                return
            await self.run_tools(result.tool_calls)

    async def prepare(self, final: bool) -> tuple[list[ChatMessage], Reading]:
        messages = sweep_orphans(self.live.view())
        if final:
            messages.append(ChatMessage("user", FINAL_ANSWER_PROMPT, turn_id=self.turn_id))
        tools = self.tools(final)
        estimate = estimate_history_tokens(messages, self.runtime.image_token_cost)
        reading = await read_meter(self.rt.resolver, self.route, estimate, tools)
        over = reading.over_capacity()
        if over:
            raise CapacityExceeded(
                f"the request needs about {reading.estimate:,} tokens but {self.route.name} holds "
                f"{reading.capacity.window:,}: {over:,} tokens over; shorten the message or switch to a "
                f"larger model", estimated=reading.estimate, window=reading.capacity.window or 0)
        return messages, reading

    async def call(self, final: bool) -> CallResult:
        messages, reading = await self.prepare(final)
        self.emit("route", turn_id=self.turn_id, **self.route.fields())
        await self.emit_context("send", reading)
        provider = self.rt.providers[self.route.provider]
        request = ProviderRequest(self.route.model, messages, self.tools(final),
                                  self.runtime.max_output_tokens)
        result = CallResult()
        self.start_reply()
        async with aclosing(provider.stream(request)) as events:  # closed at once on stop
            async for event in events:
                await self.on_event(event, result)
        if result.usage is not None:
            await self.account(result.usage, reading)
        if result.finish == "length":
            self.emit("notice", code="reply_truncated", turn_id=self.turn_id, message=(
                f"{self.route.name} stopped at its output limit (runtime.max_output_tokens = "
                f"{self.runtime.max_output_tokens:,}); the reply is incomplete."))
        return result

    async def on_event(self, event: StreamEvent, result: CallResult) -> None:
        if isinstance(event, TextDelta):  # the hot path: one per streamed piece
            result.text += event.text
            self.reply_parts.append(event.text)
            self.live.emit({"type": "chunk", "turn_id": self.turn_id, "content": event.text})
            if not self.reply_listed:  # in the transcript at once (snapshots), in the store soon
                self.live.add(self.start_reply(), sendable=False)
                self.reply_listed, self.last_flush = True, time.monotonic()
            elif time.monotonic() - self.last_flush >= self.flush_interval:
                await self.maybe_flush()
        elif isinstance(event, ThinkingDelta):
            self.emit("thinking", turn_id=self.turn_id, content=event.text)
        elif isinstance(event, ToolCallEvent):
            result.tool_calls.append(ToolCall(event.id, event.name, event.arguments))
        elif isinstance(event, Usage):
            result.usage = event
        elif isinstance(event, Finish):
            result.finish = event.reason

    async def account(self, usage: Usage, reading: Reading) -> None:
        if self.silently_truncated(usage, reading):
            self.emit("notice", code="provider_truncated", turn_id=self.turn_id, message=(
                f"{self.route.name} read only {usage.input_tokens:,} prompt tokens where about "
                f"{self.rt.resolver.calibration.apply(self.route, reading.estimate):,} were sent: it "
                f"probably cut the start of the conversation to fit its context (num_ctx). Set num_ctx "
                f"or context_window for this provider so meterchat trims whole turns instead."))
        else:  # a truncated count says nothing about the tokenizer: keep it out of the calibration
            self.rt.resolver.calibration.observe(self.route, reading.estimate, usage.input_tokens)
        cost = self.rt.resolver.cost(self.route, usage.input_tokens, usage.output_tokens)
        totals = self.totals
        totals.input_tokens += usage.input_tokens
        totals.output_tokens += usage.output_tokens
        totals.last_input_tokens = usage.input_tokens
        if cost is not None:
            totals.cost_usd = (totals.cost_usd or 0.0) + cost
        await self.rt.store.record_call(self.live.id, CallRecord(
            self.turn_id, self.route.provider, self.route.model, self.route.kind, usage.input_tokens,
            usage.output_tokens, "provider", cost))
        await self.emit_context("usage", reading, reported=usage.input_tokens)

    def silently_truncated(self, usage: Usage, reading: Reading) -> bool:
        """Ollama answers an over-long prompt with HTTP 200 after dropping its start; the only
        trace is a prompt count far below what was sent."""
        if self.rt.settings.providers[self.route.provider].kind != "ollama":
            return False
        expected = self.rt.resolver.calibration.apply(self.route, reading.estimate)
        return expected >= TRUNCATION_MIN_TOKENS and usage.input_tokens < expected * TRUNCATION_RATIO

    # --- the reply message --------------------------------------------------------------------

    def start_reply(self) -> ChatMessage:
        if self.reply is None:
            self.reply = ChatMessage("assistant", "", turn_id=self.turn_id, interrupted=True)
            self.live.streaming = (self.reply, self.reply_parts)
        return self.reply

    def sync_reply(self) -> None:
        if self.reply is not None:
            self.reply.set_content("".join(self.reply_parts))

    async def maybe_flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.reply is None or (not force and now - self.last_flush < self.flush_interval):
            return
        self.last_flush = now
        self.sync_reply()
        await self.rt.store.save_messages(self.live.id, [self.reply])

    async def close_reply(self, tool_calls: Sequence[ToolCall] | None = None) -> None:
        """End the current assistant message (before tool results, or at the end of the turn)."""
        reply = self.reply
        if reply is None:
            return
        self.sync_reply()
        reply.tool_calls = list(tool_calls) if tool_calls else None
        reply._text_tokens = None
        self.live.streaming = None
        if reply.content or reply.tool_calls:  # an empty reply was never stored: nothing to keep
            self.live.complete(reply, listed=self.reply_listed)
            await self.rt.store.save_messages(self.live.id, [reply])
            self.final_text = "" if reply.tool_calls else reply.content
        self.reply, self.reply_parts, self.reply_listed = None, [], False

    async def finish_reply(self, *, interrupted: bool) -> None:
        if self.reply is not None:
            self.reply.interrupted = interrupted
        await self.close_reply()

    async def run_tools(self, calls: list[ToolCall]) -> None:
        self.start_reply().interrupted = False  # a reply that asks for tools is complete
        await self.close_reply(calls)
        results = []
        for call in calls:
            self.emit("tool_call", turn_id=self.turn_id, id=call.id, name=call.name, args=call.arguments)
            output = cap_tool_result(await run_tool(call.name, call.arguments),
                                     self.runtime.max_tool_result_chars)
            self.emit("tool_result", turn_id=self.turn_id, id=call.id, name=call.name, output=output)
            results.append(ChatMessage("tool", output, tool_call_id=call.id, name=call.name,
                                       turn_id=self.turn_id))
        self.live.add(*results)
        await self.rt.store.append_messages(self.live.id, results)

    async def emit_done(self) -> None:
        capacity = await self.rt.resolver.capacity(self.route)
        budget = self.rt.resolver.budget(capacity)
        t = self.totals
        self.emit("done", turn_id=self.turn_id, full_response=self.final_text, input_tokens=t.input_tokens,
                  output_tokens=t.output_tokens, last_input_tokens=t.last_input_tokens,
                  provider=self.route.provider, model=self.route.model, max_context_tokens=budget,
                  model_context_window=capacity.window, cost_usd=t.cost_usd)
