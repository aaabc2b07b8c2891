"""``Turn``: one user turn: route, trim, call, tool loop, recovery, accounting.

Order of a turn (seed 000): the user's message is durable before the turn's reply is stored and before
``done`` (its write runs beside the provider call: ``Session.store_soon``); the route for
the call is resolved once (a classifier hint may pick another route for this turn only) and its
capacity and budget drive trimming, the capacity check, the meter and cost alike. Before each
provider call the turn-limit and token-budget trims run on whole turns, the request's estimate is
checked against the route's known window, and a provider's context-overflow error trims to 2/3 of
the estimate and retries (each retry uses an iteration). At ``max_tool_iterations`` one last call
without tools asks for a final answer. A reply that ends early is kept, marked interrupted.

The turn changes the history only through its ``Session`` and writes each reply through a
``ReplyWriter``.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio.lowlevel

from server.errors import (
    CapacityExceeded,
    ContextOverflow,
    MeterchatError,
    StoreUnavailable,
    error_frame,
)
from server.history.messages import ChatMessage, ToolCall, estimate_history_tokens, without_old_tool_images
from server.history.trim import sweep_orphans
from server.protocol import server_frame
from server.providers.base import (
    Finish,
    ProviderRequest,
    ReplyLimits,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from server.routing.anchor import reply_tokens
from server.routing.meter import Reading
from server.routing.resolver import Route
from server.sessions import turn_trims as trims
from server.sessions.call_frames import CallFrames
from server.sessions.compaction_runner import Compaction, NoCompaction
from server.sessions.reply import ReplyWriter, Step
from server.sessions.runtime import Runtime
from server.sessions.session import Session, utc_now
from server.sessions.set_aside import set_aside
from server.sessions.tool_calls import ToolRound
from server.sessions.usage import Totals, silently_truncated
from server.store.base import CallRecord

log = logging.getLogger(__name__)

FINAL_ANSWER_PROMPT = (
    "[Tool limit reached] Answer the user now from what you have; no more tool calls are possible."
)
SET_ASIDE_UNFIT = "not sent: the request did not fit the model's context window"


@dataclass
class CallResult:
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish: str | None = None


async def _nothing() -> None:
    return None


class Turn:
    def __init__(self, rt: Runtime, session: Session, turn_id: str, route: Route,
                 compaction: Compaction | None = None) -> None:
        self.rt = rt
        self.session = session
        self.turn_id = turn_id
        self.route = route
        self.options = rt.options
        self.compaction = compaction or NoCompaction()
        self.totals = Totals()
        self.writer = ReplyWriter(turn_id, rt.settings.server.store_flush_ms / 1000)
        self.final_text = ""
        self.sent: Reading | None = None  # the reading of the request last sent
        self.reply_count: int | None = None  # the provider's count of the reply being finished
        self.final_at: str | None = None  # when the final reply began: the page's hover time
        self.call_ids: set[str] | None = None  # tool call ids the session holds (unique_call_id)
        # Lets go of the session's hold (live mode: its lease in Redis) before the turn's last
        # frame: a client may send the next message, to any instance, the moment it sees it.
        self.let_go: Callable[[], Awaitable[None]] = _nothing

    # --- frames -------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: object) -> None:
        self.session.emit(server_frame(kind, **fields))

    async def emit_meter(self, reason: str, reading: Reading | None = None,
                         reported: int | None = None) -> Reading:
        return await self.session.emit_meter(self.route, reason, reading, reported)

    def tools(self, final: bool = False) -> list[ToolSpec]:
        return self.rt.meter.tools(self.route, final)

    # --- the loop -----------------------------------------------------------------------------

    def tell_tools_unavailable(self) -> None:
        """Configured MCP servers this route would offer that are down: the user learns why."""
        missing = self.rt.toolbox.unavailable(self.rt.settings.providers[self.route.provider])
        if missing:
            self.emit("notice", code="tools_unavailable", turn_id=self.turn_id, message=(
                f"The tools of {', '.join(missing)} are unavailable (the MCP server is not running); "
                f"this turn goes on without them."))

    def tell_unknown_hint(self) -> None:
        """A hint no route has: the turn stays on the session's pair, and the user is told which exist."""
        if self.route.kind != "fallback":
            return
        hints = self.rt.resolver.hints()
        known = ", ".join(f"{name} ({route.name})" for name, route in hints.items()) or "none configured"
        self.emit("notice", code="unknown_hint", turn_id=self.turn_id, message=(
            f"No route has the hint {self.route.hint!r}, so this turn goes to {self.route.name}. "
            f"Hints: {known}."))

    async def run(self) -> None:
        self.rt.metrics.turn_started()
        try:
            await self.attempt()
        finally:
            self.rt.metrics.turn_ended()

    async def attempt(self) -> None:
        self.tell_unknown_hint()
        self.tell_tools_unavailable()
        try:
            await self.loop()
        except CapacityExceeded as exc:
            await self.finish_reply(interrupted=True)
            # Kept in the transcript but not sent again, so one oversized message cannot block
            # every later turn when proactive trimming is off.
            await set_aside(self.session, self.turn_id, SET_ASIDE_UNFIT)
            await self.last(error_frame(exc, turn_id=self.turn_id))
        except MeterchatError as exc:
            await self.fail(exc)
        except Exception as exc:  # a bug must not take the session down; the user is told
            log.exception("turn %s of session %s failed", self.turn_id, self.session.id)
            await self.fail(exc)
        else:
            try:
                await self.finish_reply(interrupted=False)
            except StoreUnavailable as exc:  # the reply is complete, only its write waits
                await self.last(error_frame(exc, turn_id=self.turn_id))
                return
            await self.end(await self.done_frame())

    async def end(self, frame: dict[str, Any]) -> None:
        """The meter shows the next send (the reply just written included) before ``done``, so a
        client that waits for ``done`` already has it. (A failed turn that kept a reply shows the
        meter before its error: ``fail``.)"""
        try:
            await self.session.emit_meter(self.session.route, "done")
        except Exception:  # the store may be what failed (learned windows are read from it)
            log.exception("meter after turn %s of session %s", self.turn_id, self.session.id)
        finally:
            await self.last(frame)

    async def last(self, frame: dict[str, Any]) -> None:
        """The turn's last frame (``done``, ``error``, ``aborted``), once the hold is let go."""
        with anyio.CancelScope(shield=True):
            await self.let_go()
        self.session.emit(frame)

    async def fail(self, exc: Exception) -> None:
        """Keep the reply, marked interrupted, and tell the clients, even when the store refuses
        the mark: the error that ended the turn may be the store's own (the reply then waits in
        ``Session.unsaved``). A reply kept is sent with the next message, so the meter shows it
        before the error (a turn that kept nothing ends with its error alone)."""
        kept = self.writer.joined
        try:
            await self.finish_reply(interrupted=True)
            if kept and not isinstance(exc, StoreUnavailable):
                await self.session.emit_meter(self.session.route, "done")
        except StoreUnavailable:
            pass  # the reply waits in Session.unsaved; the hub writes it when the store recovers
        except Exception:  # the meter must never hide the error that ended the turn
            log.exception("meter after turn %s of session %s", self.turn_id, self.session.id)
        finally:
            await self.last(error_frame(exc, turn_id=self.turn_id))

    async def loop(self) -> None:
        limit = self.options.max_tool_iterations
        iteration = 0
        while iteration <= limit:
            final = iteration == limit
            self.session.defer_frames()  # sent once the request has left (CallFrames)
            try:
                reading = await trims.before_call(self, final)
                iteration += 1
                result = await self.call(final, reading)
            except ContextOverflow as overflow:
                self.session.flush_frames()
                await trims.after_overflow(self, overflow, final)
                if final:  # the final answer is still owed: retry it (each recovery drops a turn)
                    iteration -= 1
                continue
            finally:
                self.session.flush_frames()  # out already if the request left; else before any error
            if not result.tool_calls or final:
                return
            await self.run_tools(result.tool_calls)

    async def prepare(self, final: bool, reading: Reading) -> tuple[list[ChatMessage], Reading]:
        """The messages to send and their reading: ``reading`` (of the session's history) stands
        when they are that history as it is, else what is sent is measured again."""
        history = self.session.to_send()
        swept = sweep_orphans(history)
        messages = without_old_tool_images(swept)  # its images are not counted either way
        if final:
            messages.append(ChatMessage("user", FINAL_ANSWER_PROMPT, turn_id=self.turn_id))
        if final or len(swept) != len(history) or not all(map(operator.is_, swept, history)):
            estimate = estimate_history_tokens(messages, self.options.image_token_cost)
            reading = await self.rt.meter.read(self.route, estimate, self.tools(final),
                                               self.session.anchors.get(self.route.name), messages)
        over = reading.over_capacity()
        if over:
            raise CapacityExceeded(
                f"the request needs about {reading.figure:,} tokens but {self.route.name} holds "
                f"{reading.capacity.window:,}: {over:,} tokens over; shorten the message or switch to a "
                f"larger model", estimated=reading.figure, window=reading.capacity.window or 0)
        return messages, reading

    async def call(self, final: bool, reading: Reading) -> CallResult:
        messages, reading = await self.prepare(final, reading)
        self.sent = reading
        self.writer.began = utc_now()  # the reply's time: when its call began, as the route frame says
        self.writer.served_by = self.route.served_by()
        announce = CallFrames(self.session, self.route, self.turn_id, self.writer.began, reading)
        provider = self.rt.providers[self.route.provider]
        limits = ReplyLimits(self.options.max_reply_chars, self.options.max_tool_argument_chars)
        request = ProviderRequest(self.route.model, messages, self.tools(final),
                                  self.options.max_output_tokens, limits, sent=announce)
        result = CallResult()
        began = time.monotonic()
        try:
            async with aclosing(provider.stream(request)) as events:  # closed at once on stop
                async for event in events:
                    if began:  # the call's first event only: one float test per chunk after it
                        announce()  # a provider that never said its request left
                        self.on_event(event, result)
                        waited, began = time.monotonic() - began, 0.0
                        self.rt.metrics.first_event(self.route.provider, self.route.model, waited)
                        # The send loop writes the first chunk now, not once the rest of the reply
                        # that came with it is handled (a short reply often comes in one read); the
                        # store writes the turn held start after it.
                        await anyio.lowlevel.checkpoint()
                        if self.session.writes is not None:
                            self.session.writes.release()
                    else:
                        self.on_event(event, result)
        finally:
            announce()  # a call that failed before its request left still shows its route first
        if result.usage is not None:
            await self.account(result.usage, reading)
        if result.finish == "length":
            self.emit("notice", code="reply_truncated", turn_id=self.turn_id, message=(
                f"{self.route.name} stopped at its output limit (runtime.max_output_tokens = "
                f"{self.options.max_output_tokens:,}); the reply is incomplete."))
        return result

    def on_event(self, event: StreamEvent, result: CallResult) -> None:
        if isinstance(event, TextDelta):  # the hot path: one per streamed piece
            self.session.emit({"type": "chunk", "turn_id": self.turn_id, "content": event.text})
            step = self.writer.append(event.text)
            if step is Step.JOIN:  # in the transcript at once (snapshots), in the store soon
                self.session.join_reply(self.writer)
            elif step is Step.FLUSH and not self.session.unsaved:  # after the user's message only
                self.rt.flusher.due(self.session.id, self.writer.flush())  # in the flusher's next batch
        elif isinstance(event, ThinkingDelta):
            self.emit("thinking", turn_id=self.turn_id, content=event.text)
            self.writer.think(event.text)
        elif isinstance(event, ToolCallEvent):
            result.tool_calls.append(ToolCall(self.unique_call_id(event.id), event.name, event.arguments))
        elif isinstance(event, Usage):
            result.usage = event
        elif isinstance(event, Finish):
            result.finish = event.reason

    def unique_call_id(self, given: str) -> str:
        """A call id no earlier call of the session has: results pair with calls by id, and some
        OpenAI-compatible servers send none (the dialect then numbers calls per reply, call_0, ...),
        so a repeated id would make the later result look answered already and drop it."""
        if self.call_ids is None:
            self.call_ids = {c.id for m in self.session.snapshot() for c in m.tool_calls or ()}
        unique, n = given or "call", 1
        while unique in self.call_ids:
            n += 1
            unique = f"{given or 'call'}_{self.turn_id[:8]}_{n}"
        self.call_ids.add(unique)
        return unique

    async def account(self, usage: Usage, reading: Reading) -> None:
        calibration = self.rt.resolver.calibration
        expected = calibration.apply(self.route, reading.estimate)
        kind = self.rt.settings.providers[self.route.provider].kind
        if silently_truncated(kind, expected, usage.input_tokens):
            self.emit("notice", code="provider_truncated", turn_id=self.turn_id, message=(
                f"{self.route.name} read only {usage.input_tokens:,} prompt tokens where about "
                f"{expected:,} were sent: it "
                f"probably cut the start of the conversation to fit its context (num_ctx). Set num_ctx "
                f"or context_window for this provider so meterchat trims whole turns instead."))
        elif usage.input_tokens > 0:  # a truncated count says nothing about the tokenizer: kept out
            calibration.observe(self.route, reading.estimate, usage.input_tokens)
            self.rt.meter.counted(self.session.anchors, reading, usage.input_tokens)
            self.reply_count = reply_tokens(usage, thinking=self.writer.thought)
        cost = self.rt.resolver.cost(self.route, usage.input_tokens, usage.output_tokens)
        self.totals.add(usage, cost)
        call = CallRecord(self.turn_id, self.route.provider, self.route.model, self.route.kind,
                          usage.input_tokens, usage.output_tokens, "provider", cost)
        self.session.calls.append(call)  # a reload shows the turn's route, usage and cost from these
        self.session.unsaved_calls.append(call)  # written with the reply: one transaction, not two
        await self.emit_meter("usage", reading, reported=usage.input_tokens)

    # --- the reply message --------------------------------------------------------------------

    async def finish_reply(self, *, interrupted: bool, tool_calls: list[ToolCall] | None = None) -> None:
        """End the current assistant message (before tool results, or at the end of the turn)."""
        message = self.writer.finish(interrupted=interrupted, tool_calls=tool_calls)
        self.session.settle_reply(message)
        self.anchor_reply(message if not interrupted else None)
        await self.rt.flusher.settle(self.session.id)  # no earlier flush may land after this save
        if message is not None:  # an empty reply was never stored: nothing to keep
            self.final_text = "" if message.tool_calls else message.content
            self.final_at = message.created_at
        # The user's message first, if its write has not landed: stored before the turn is done.
        await self.session.save_reply(*([message] if message is not None else []))
        await self.session.check_writes()

    def anchor_reply(self, message: ChatMessage | None) -> None:
        """Move the route's anchor past the reply just settled, by the provider's count of it: the
        next request is then that count plus only what comes after the reply."""
        count, self.reply_count = self.reply_count, None
        if message is not None and count is not None:
            self.rt.meter.replied(self.session.anchors, self.route.name, message, count)

    async def run_tools(self, calls: list[ToolCall]) -> None:
        await self.finish_reply(interrupted=False, tool_calls=calls)  # a reply asking for tools is complete
        results = await ToolRound(self.rt, self.turn_id, self.emit, self.tools(),
                                  self.session.approvals).run(calls)
        self.session.add(*results)
        await self.rt.store.append_messages(self.session.id, results)

    async def done_frame(self) -> dict[str, Any]:
        capacity = await self.rt.resolver.capacity(self.route)
        budget = self.rt.resolver.budget(capacity)
        t = self.totals
        return server_frame(
            "done", turn_id=self.turn_id, full_response=self.final_text, input_tokens=t.input_tokens,
            output_tokens=t.output_tokens, last_input_tokens=t.last_input_tokens,
            provider=self.route.provider, model=self.route.model, max_context_tokens=budget,
            model_context_window=capacity.window, cost_usd=t.cost_usd, calls=t.calls,
            created_at=self.final_at or utc_now())
