"""Whole-turn trimming of the provider-facing history (pure: no I/O, no clock, no globals).

Turns: a turn starts at a real user message (``is_turn_start``) and holds everything up to the next
one, so a tool call and its results always share a turn and are kept or dropped together. A user
message whose text begins with ``[Tool results]`` belongs to the turn before it. The breadcrumb is
never a turn. Leading system messages (and a breadcrumb right after them) always stay; rows before
the first turn (an orphan tool result, a summary) drop with the first turn.

``trim_to_recent_turns`` drops the fewest oldest whole turns so the estimate fits ``budget``;
``trim_to_recent_turn_count`` keeps the newest ``max(max_turns, 1)`` turns. Both always keep the
newest turn, and when nothing needs dropping return the same messages in the same order. When
something is dropped, one breadcrumb sits right after the leading system messages (an existing one
is reused). Inputs are never mutated: the caller marks ``TrimReport.dropped`` as trimmed.

The input is the history as it will be sent (``history.visible``). A session's every-turn path uses
``server.history.ledger.HistoryLedger``, which does the same arithmetic incrementally. These whole-list
functions are kept on purpose: they are the plain statement of what a trim must do, and the oracle the
ledger is tested against (``tests/test_history_trim.py`` runs both over the same histories).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from server.history.messages import (
    BREADCRUMB_TEXT,
    DEFAULT_IMAGE_TOKEN_COST,
    ChatMessage,
    current_turn_start,
    image_tokens,
    is_turn_start,
)

REASON_TOKEN_BUDGET = "token_budget"
REASON_TURN_LIMIT = "turn_limit"
REASON_OVERFLOW = "overflow_recovery"

_IMAGE_MARKER = re.compile(r"\[IMAGE:[^\]]*\]")


def new_breadcrumb() -> ChatMessage:
    return ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True)


BREADCRUMB_TOKENS = new_breadcrumb().text_tokens


@dataclass(kw_only=True)
class TrimReport:
    """What a trim dropped; ``dropped_messages`` and ``trimmed`` follow from ``dropped``."""

    dropped: list[ChatMessage]
    dropped_turns: int
    kept_turns: int
    tokens_before: int
    tokens_after: int
    reason: str
    token_budget: int | None = None
    dropped_messages: int = field(init=False)
    trimmed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.dropped_messages = len(self.dropped)
        self.trimmed = bool(self.dropped)

    def frame_fields(self) -> dict[str, Any]:
        """Body of a ``history_trimmed`` frame; token fields only on token-driven trims."""
        body: dict[str, Any] = {"dropped_messages": self.dropped_messages,
                                "dropped_turns": self.dropped_turns,
                                "kept_turns": self.kept_turns, "reason": self.reason}
        if self.reason != REASON_TURN_LIMIT:
            if self.token_budget is not None:
                body["token_budget"] = self.token_budget
            body["tokens_before"] = self.tokens_before
            body["tokens_after"] = self.tokens_after
        return body


@dataclass(kw_only=True)
class TrimResult(TrimReport):
    """A trim's report plus the messages to send."""

    messages: list[ChatMessage]


@dataclass(frozen=True)
class _Layout:
    system_end: int  # messages[:system_end] are the leading system messages
    crumb: ChatMessage | None  # a breadcrumb right after them
    starts: list[int]  # index of each turn start, oldest first

    @property
    def body_start(self) -> int:
        return self.system_end + (self.crumb is not None)


def _layout(messages: Sequence[ChatMessage]) -> _Layout:
    end = 0
    while end < len(messages) and messages[end].role == "system":
        end += 1
    crumb = messages[end] if end < len(messages) and messages[end].breadcrumb else None
    first = end + (crumb is not None)
    starts = [i for i in range(first, len(messages)) if is_turn_start(messages[i])]
    return _Layout(end, crumb, starts)


def message_costs(messages: Sequence[ChatMessage],
                  image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> list[int]:
    """Each message's share of ``estimate_history_tokens`` (they sum to it)."""
    turn_start = current_turn_start(messages)
    return [message.text_tokens + image_tokens(message, in_current_turn=index >= turn_start,
                                               image_token_cost=image_token_cost)
            for index, message in enumerate(messages)]


def _suffix_sums(costs: list[int]) -> list[int]:
    sums = [0] * (len(costs) + 1)
    for index in range(len(costs) - 1, -1, -1):
        sums[index] = sums[index + 1] + costs[index]
    return sums


def _turns_to_drop(layout: _Layout, costs: list[int], budget: int) -> int:
    """Fewest oldest turns whose removal fits ``budget``; all but the newest when nothing fits."""
    # Dropping turns never changes which rows are in the current turn, so costs stay valid.
    suffix = _suffix_sums(costs)
    crumb = costs[layout.system_end] if layout.crumb is not None else BREADCRUMB_TOKENS
    fixed = sum(costs[:layout.system_end]) + crumb
    last = len(layout.starts) - 1
    for k in range(1, last):
        if fixed + suffix[layout.starts[k]] <= budget:
            return k
    return last


def _untouched(messages: Sequence[ChatMessage], layout: _Layout, tokens: int, reason: str,
               budget: int | None) -> TrimResult:
    return TrimResult(messages=list(messages), dropped=[], dropped_turns=0,
                      kept_turns=len(layout.starts), tokens_before=tokens, tokens_after=tokens,
                      reason=reason, token_budget=budget)


def _drop_turns(messages: Sequence[ChatMessage], layout: _Layout, k: int, tokens_before: int,
                reason: str, budget: int | None, image_token_cost: int) -> TrimResult:
    cut = layout.starts[k]
    dropped = list(messages[layout.body_start:cut])
    body = list(messages[cut:])
    strays = [message for message in body if message.breadcrumb]
    if strays:  # a breadcrumb left inside the body by an edited session: keep exactly one
        body = [message for message in body if not message.breadcrumb]
        dropped.extend(strays)
    crumb = layout.crumb or (strays[0] if strays else new_breadcrumb())
    if crumb in dropped:
        dropped.remove(crumb)
    kept = [*messages[:layout.system_end], crumb, *body]
    return TrimResult(messages=kept, dropped=dropped, dropped_turns=k,
                      kept_turns=len(layout.starts) - k, tokens_before=tokens_before,
                      tokens_after=sum(message_costs(kept, image_token_cost)), reason=reason,
                      token_budget=budget)


def trim_to_recent_turns(messages: Sequence[ChatMessage], budget: int, *,
                         image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST,
                         reason: str = REASON_TOKEN_BUDGET) -> TrimResult:
    """Drop the fewest oldest whole turns so the estimate fits ``budget`` (0 = never trim)."""
    costs = message_costs(messages, image_token_cost)
    tokens = sum(costs)
    layout = _layout(messages)
    if budget <= 0 or tokens <= budget or len(layout.starts) <= 1:
        return _untouched(messages, layout, tokens, reason, budget)
    k = _turns_to_drop(layout, costs, budget)
    return _drop_turns(messages, layout, k, tokens, reason, budget, image_token_cost)


def trim_to_recent_turn_count(messages: Sequence[ChatMessage], max_turns: int, *,
                              image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> TrimResult:
    """Keep the newest ``max(max_turns, 1)`` whole turns: 0 still keeps the newest one."""
    layout = _layout(messages)
    tokens = sum(message_costs(messages, image_token_cost))
    excess = len(layout.starts) - max(max_turns, 1)
    if excess <= 0:
        return _untouched(messages, layout, tokens, REASON_TURN_LIMIT, None)
    return _drop_turns(messages, layout, excess, tokens, REASON_TURN_LIMIT, None, image_token_cost)


def recovery_budget(estimate: int) -> int:
    """Reactive target after a provider reports overflow: two thirds of the current estimate."""
    return estimate * 2 // 3


def trim_for_overflow(messages: Sequence[ChatMessage], *,
                      image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> TrimResult:
    """Trim to ``recovery_budget`` of the estimate; ``trimmed`` False means raise ``HistoryUnfit``."""
    estimate = sum(message_costs(messages, image_token_cost))
    return trim_to_recent_turns(messages, recovery_budget(estimate),
                                image_token_cost=image_token_cost, reason=REASON_OVERFLOW)


def trim_preview(messages: Sequence[ChatMessage], budget: int, *,
                 image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> tuple[int, int]:
    """(turns, tokens) the next send would drop at ``budget``; tokens is the net estimate fall."""
    result = trim_to_recent_turns(messages, budget, image_token_cost=image_token_cost)
    return result.dropped_turns, max(0, result.tokens_before - result.tokens_after)


def _outside_marker(text: str, cut: int, *, backwards: bool) -> int:
    for match in _IMAGE_MARKER.finditer(text):
        if match.start() < cut < match.end():
            return match.start() if backwards else match.end()
    return cut


def cap_tool_result(text: str, max_chars: int) -> str:
    """Keep the first 2/3 and last 1/3 of ``max_chars`` characters (0 = unlimited).

    A cut that would fall inside an ``[IMAGE:...]`` marker moves outwards so the marker is
    dropped whole rather than split.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head_end = _outside_marker(text, max_chars * 2 // 3, backwards=True)
    tail_start = _outside_marker(text, len(text) - (max_chars - max_chars * 2 // 3), backwards=False)
    omitted = tail_start - head_end
    return f"{text[:head_end]}\n\n[... {omitted} characters truncated ...]\n\n{text[tail_start:]}"


def _answered_calls(messages: Sequence[ChatMessage]) -> tuple[set[str], set[str], set[int]]:
    """Call ids asked for, those with a result after their call, and the indices of results that
    answer nothing."""
    called: set[str] = set()
    answered: set[str] = set()
    orphans: set[int] = set()
    for index, message in enumerate(messages):
        if message.tool_calls:
            called.update(call.id for call in message.tool_calls)
        if message.role != "tool":
            continue
        if message.tool_call_id in called and message.tool_call_id not in answered:
            answered.add(message.tool_call_id)
        else:
            orphans.add(index)
    return called, answered, orphans


def _without_unanswered(message: ChatMessage, answered: set[str]) -> ChatMessage | None:
    calls = message.tool_calls or []
    kept = [call for call in calls if call.id in answered]
    if len(kept) == len(calls):
        return message
    if not kept and not message.content:
        return None
    # A copy, not an edit: the transcript keeps what the model really said.
    copy = replace(message)
    copy.set_tool_calls(kept)
    return copy


def sweep_orphans(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Make a restored or edited history pairable: the last safety net, not the main guarantee.

    Drops ``tool`` results whose call id no earlier assistant message asked for (and repeats of an
    answered id). Providers reject an assistant tool call without a result, so unanswered calls are
    removed from their assistant message: a message left with no calls and no text is dropped, one
    with text is replaced by a copy (same id) without those calls. Order is kept; inputs are not
    mutated. ``[Tool results]`` user messages carry no call id and are left alone.
    """
    called, answered, orphans = _answered_calls(messages)
    if not called and not orphans:
        return list(messages)  # no tool message at all (the common history): nothing to sweep
    swept: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if index in orphans:
            continue
        kept = _without_unanswered(message, answered) if message.tool_calls else message
        if kept is not None:
            swept.append(kept)
    return swept
