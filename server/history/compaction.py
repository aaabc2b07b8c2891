"""Group compaction (truncation or summarization) over the sent history (no I/O, no clock).

Messages are grouped so nothing that belongs together is cut apart:

    system          a system message; never excluded
    user            a real user message
    assistant_text  an assistant reply without tool calls
    tool_call       an assistant message with tool calls plus every result linked to it by call id
                    (not by adjacency); a ``[Tool results]`` user message joins the group before it;
                    a result whose call is unknown is an orphan tool_call group of its own
    summary         a summary or breadcrumb the runtime wrote

Trigger: the estimate of the visible messages exceeds ``tokens_exceed`` (strict). Stop rule (seed
004): with no ``target_tokens``, exclusion stops as soon as the count no longer exceeds the trigger;
``0 < target_tokens <= tokens_exceed`` stops at or below that target instead (a lower target is the
explicit way to leave headroom so compaction does not fire again on the next turn). Exclusion
takes the oldest non-system groups, never the newest ``minimum_preserved_groups`` nor the current
turn, and always ends just before a ``user`` group: the messages still sent never open (after system
messages) with a tool result or an assistant message.
When no boundary reaches the target, the latest allowed one is used.

Truncation leaves the excluded messages out (``message.left_out = reason``); nothing is deleted.
Summarization is a plan: the caller sends ``summary_request(plan)`` to a model and then calls
``apply_summary``, which marks the groups and inserts a ``[Summary]`` message where they began.
``rollback(plan)`` undoes either. A pass over a history that fits changes nothing.

Not pure: ``plan_compaction`` only reads, but ``apply_truncation``, ``apply_summary`` and ``rollback``
change the planned messages' marks in place, and ``apply_summary`` inserts into the transcript it is
given. The caller (``server.sessions.compaction_runner``) stores the marks and rebuilds the session's ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from server.config.settings import CompactionSettings
from server.history.messages import DEFAULT_IMAGE_TOKEN_COST, TOOL_RESULTS_PREFIX, ChatMessage, visible
from server.history.trim import cap_tool_result, message_costs

TRUNCATED = "truncated by compaction"
SUMMARIZED = "summarized by compaction"
SUMMARY_PREFIX = "[Summary]"
SUMMARY_TOOL_CHARS = 2000  # a tool result's share of the summarisation request
SUMMARY_INSTRUCTIONS = (
    "Summarise the earlier conversation below so it can replace it. Keep the user's stated "
    "preferences and rules, facts about the user and the task, decisions made, tool findings that "
    "still matter, and open questions. Write plain prose without a preamble."
)


@dataclass
class MessageGroup:
    kind: str
    messages: list[ChatMessage] = field(default_factory=list)
    tokens: int = 0


@dataclass
class CompactionPlan:
    strategy: str
    trigger: int
    target: int
    tokens_before: int
    tokens_after: int  # estimate once the groups are excluded, before any summary is added
    groups: list[MessageGroup]  # to exclude, oldest first
    request_text: str = ""
    summary: ChatMessage | None = None
    _marks: list[tuple[ChatMessage, str | None]] = field(default_factory=list, repr=False)
    _transcript: list[ChatMessage] | None = field(default=None, repr=False)

    @property
    def needed(self) -> bool:
        return bool(self.groups)

    @property
    def excluded_messages(self) -> list[ChatMessage]:
        return [message for group in self.groups for message in group.messages]


def _kind_of(message: ChatMessage) -> str:
    if message.summary or message.breadcrumb:
        return "summary"
    if message.role == "system":
        return "system"
    if message.role == "user":
        return "user"
    return "tool_call" if message.tool_calls or message.role == "tool" else "assistant_text"


def _group_for(message: ChatMessage, groups: list[MessageGroup],
               owners: dict[str, MessageGroup]) -> MessageGroup:
    if message.role == "tool" and message.tool_call_id in owners:
        return owners[message.tool_call_id]
    last = groups[-1] if groups else None
    is_output = message.role == "user" and message.content.startswith(TOOL_RESULTS_PREFIX)
    if is_output and last is not None and last.kind in ("assistant_text", "tool_call"):
        last.kind = "tool_call"  # the XML dialect: the call is in the assistant's text
        return last
    group = MessageGroup("tool_call" if is_output else _kind_of(message))
    groups.append(group)
    for call in message.tool_calls or ():
        owners[call.id] = group
    return group


def build_groups(messages: Sequence[ChatMessage], *,
                 image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> list[MessageGroup]:
    """Groups of ``messages`` (as sent), ordered by their first message."""
    groups: list[MessageGroup] = []
    owners: dict[str, MessageGroup] = {}
    for message, cost in zip(messages, message_costs(messages, image_token_cost), strict=True):
        group = _group_for(message, groups, owners)
        group.messages.append(message)
        group.tokens += cost
    return groups


def compaction_target(settings: CompactionSettings) -> int:
    """Where exclusion stops: ``target_tokens`` when 0 < target <= trigger, else the trigger itself
    (the seed's default: remove groups until the count no longer exceeds the trigger)."""
    target = settings.target_tokens
    if target is not None and 0 < target <= settings.tokens_exceed:
        return target
    return settings.tokens_exceed


def _cut(groups: list[MessageGroup], tokens: int, target: int, preserved: int) -> int:
    """How many of the oldest non-system ``groups`` to exclude; the next one is a user group."""
    users = [index for index, group in enumerate(groups) if group.kind == "user"]
    if not users:
        return 0
    limit = min(len(groups) - max(preserved, 0), users[-1])  # the current turn always stays
    cuts = [index for index in users if 0 < index <= limit]
    dropped = 0
    done = 0
    for cut in cuts:
        dropped += sum(group.tokens for group in groups[done:cut])
        done = cut
        if tokens - dropped <= target:
            return cut
    return cuts[-1] if cuts else 0


def _line(message: ChatMessage) -> str | None:
    if message.breadcrumb:
        return None
    if message.summary:
        return f"earlier summary: {message.content.removeprefix(SUMMARY_PREFIX).strip()}"
    if message.role == "tool":
        output = cap_tool_result(message.content, SUMMARY_TOOL_CHARS)
        return f"tool result ({message.name or 'tool'}): {output}"
    calls = ", ".join(f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
                      for call in message.tool_calls or ())
    text = f"{message.role}: {message.content}".rstrip()
    return f"{text}\n(called {calls})" if calls else text


def build_request_text(messages: Sequence[ChatMessage]) -> str:
    lines = [line for line in map(_line, messages) if line]
    return SUMMARY_INSTRUCTIONS + "\n\n" + "\n\n".join(lines)


def plan_compaction(messages: Sequence[ChatMessage], settings: CompactionSettings, *,
                    image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> CompactionPlan:
    """Which groups of the visible ``messages`` to exclude; changes nothing."""
    sent = visible(messages)
    costs = message_costs(sent, image_token_cost)
    tokens = sum(costs)
    trigger, target = settings.tokens_exceed, compaction_target(settings)
    plan = CompactionPlan(settings.strategy, trigger, target, tokens, tokens, [])
    if settings.strategy == "none" or trigger <= 0 or tokens <= trigger:
        return plan
    groups = [g for g in build_groups(sent, image_token_cost=image_token_cost) if g.kind != "system"]
    plan.groups = groups[:_cut(groups, tokens, target, settings.minimum_preserved_groups)]
    plan.tokens_after = tokens - sum(group.tokens for group in plan.groups)
    if settings.strategy == "summarization" and plan.groups:
        plan.request_text = build_request_text(plan.excluded_messages)
    return plan


def _mark(plan: CompactionPlan, reason: str) -> None:
    for message in plan.excluded_messages:
        plan._marks.append((message, message.left_out))
        message.left_out = reason


def apply_truncation(plan: CompactionPlan) -> None:
    """Mark the plan's groups excluded; they stay in the transcript."""
    _mark(plan, TRUNCATED)


def compact(messages: Sequence[ChatMessage], settings: CompactionSettings, *,
            image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> CompactionPlan:
    """Plan, and for truncation apply at once; a summarization plan waits for ``apply_summary``."""
    plan = plan_compaction(messages, settings, image_token_cost=image_token_cost)
    if plan.strategy == "truncation" and plan.needed:
        apply_truncation(plan)
    return plan


def summary_request(plan: CompactionPlan) -> list[ChatMessage]:
    """The messages to send the summarising model."""
    return [ChatMessage("user", plan.request_text)]


def apply_summary(messages: list[ChatMessage], plan: CompactionPlan, summary_text: str, *,
                  role: str = "user") -> ChatMessage:
    """Mark the plan's groups excluded and insert the summary where they began."""
    if not plan.needed:
        raise ValueError("apply_summary: the plan excludes nothing")
    first = plan.groups[0].messages[0]
    index = next(i for i, message in enumerate(messages) if message is first)
    body = summary_text.strip() or "(the summariser returned nothing)"
    summary = ChatMessage(role, f"{SUMMARY_PREFIX}\n{body}", summary=True)
    _mark(plan, SUMMARIZED)
    messages.insert(index, summary)
    plan.summary, plan._transcript = summary, messages
    return summary


def rollback(plan: CompactionPlan) -> None:
    """Restore every mark the plan set and take out its summary, if one was inserted."""
    for message, previous in reversed(plan._marks):
        message.left_out = previous
    plan._marks.clear()
    if plan.summary is not None and plan._transcript is not None:
        plan._transcript[:] = [m for m in plan._transcript if m is not plan.summary]
    plan.summary = plan._transcript = None
