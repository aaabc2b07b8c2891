"""A stored session as a readable Markdown file: a head, every message with its role and marks, the
session's trims and other lines (errors, notices, switches, stops, a typed ``/model``) where the page
draws them, and a table of the provider calls. Export only: the JSON document (``server.web.export``) is
what an import reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from server.history.messages import ChatMessage, stored_marks
from server.store.base import CallRecord, StoredSession


def to_markdown(session: StoredSession) -> str:
    """A readable transcript: head, every message with its role and marks, the trims and the other
    lines where the page draws them (a trim above the turn it happened in, a line after the message
    it followed), then the calls."""
    parts = [f"# {session.title or 'Untitled session'}", "",
             f"- Route: `{session.route}`", f"- Created: {session.created_at}",
             f"- Updated: {session.updated_at}", f"- Session: `{session.id}`", ""]
    before, after = _placed_lines(session)
    parts.extend(after.pop(None, []))
    for index, message in enumerate(session.messages, 1):
        parts.extend(before.pop(message.turn_id, []) if message.turn_id else [])
        parts.extend(["---", "", _message_heading(index, message), ""])
        parts.extend(_message_body(message))
        parts.extend(after.pop(message.id, []))
    parts.extend(line for lines in (*before.values(), *after.values()) for line in lines)  # of no message
    if session.calls:
        parts.extend(["---", "", "## Provider calls", "", *_calls_table(session.calls), ""])
    return "\n".join(parts).rstrip("\n") + "\n"


def _placed_lines(session: StoredSession) -> tuple[dict[str | None, list[str]], dict[str | None, list[str]]]:
    """Quoted lines to put above a turn (turn id -> lines: its trims) and after a message (message
    id -> lines; None: before the first message)."""
    before: dict[str | None, list[str]] = {}
    after: dict[str | None, list[str]] = {}
    for trim in session.trims:
        if trim.get("turn_id"):
            before.setdefault(trim["turn_id"], []).extend([f"> _{_trim_text(trim)}_", ""])
        else:
            after.setdefault(trim.get("after_message_id"), []).extend([f"> _{_trim_text(trim)}_", ""])
    for notice in session.notices:
        text = _notice_text(notice)
        if text:
            after.setdefault(notice.get("after_message_id"), []).extend([f"> {text}", ""])
    return before, after


_TRIM_WHY = {"token_budget": "over the token budget", "turn_limit": "over the turn limit",
             "overflow_recovery": "the provider reported a context overflow", "compaction": "compaction"}


def _trim_text(trim: Mapping[str, Any]) -> str:
    turns = trim["dropped_turns"]
    text = f"Trimmed: {turns:,} turn{'' if turns == 1 else 's'} dropped ({_TRIM_WHY.get(trim['reason'])})"
    if isinstance(trim.get("tokens_before"), int) and isinstance(trim.get("tokens_after"), int):
        text += f": {trim['tokens_before']:,} -> {trim['tokens_after']:,} tokens"
    return text


def _notice_text(notice: Mapping[str, Any]) -> str | None:
    kind = notice["type"]
    route = notice.get("route") or notice
    if kind in ("error", "notice"):
        return f"**{kind.capitalize()}** `{notice['code']}`: {' '.join(notice['message'].split())}"
    if kind == "context":
        return f"**Switched** to `{route['provider']}/{route['model']}`"
    if kind == "route":
        return f"**Hint** `{notice.get('hint')}`: served by `{route['provider']}/{route['model']}`"
    if kind == "aborted":
        return "**Stopped**"
    if kind == "command":
        return f"**Command** `{notice['content']}`"
    return None


def _message_heading(index: int, message: ChatMessage) -> str:
    marks = []
    if message.breadcrumb:
        marks.append("breadcrumb")
    if message.summary:
        marks.append("summary")
    trimmed, excluded = stored_marks(message)
    if trimmed:
        marks.append("trimmed, no longer sent")
    if excluded is not None:
        marks.append(f"excluded: {excluded}")
    if message.interrupted:
        marks.append("interrupted")
    suffix = f" _({'; '.join(marks)})_" if marks else ""
    return f"## {index}. {message.role.capitalize()}{suffix}"


def _message_body(message: ChatMessage) -> list[str]:
    lines: list[str] = []
    if message.role == "tool":
        label = f"**Tool result** `{message.name or '?'}` (call `{message.tool_call_id or '?'}`)"
        lines.extend([label, "", *_fenced(message.content, "text"), ""])
    elif message.content:
        lines.extend([message.content, ""])
    for call in message.tool_calls or ():
        arguments = json.dumps(call.arguments, ensure_ascii=False, indent=2)
        lines.extend([f"**Tool call** `{call.name}` (id `{call.id}`)", "", *_fenced(arguments, "json"), ""])
    for image in message.images or ():
        lines.extend([f"_[image: {image.media_type}, {len(image.data) * 3 // 4} bytes]_", ""])
    return lines


def _fenced(text: str, language: str) -> list[str]:
    """A code fence longer than any backtick run inside ``text``, so the block cannot break out."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{language}", text, fence]


def _calls_table(calls: list[CallRecord]) -> list[str]:
    rows = ["| turn | provider/model | route | input | output | tokens | cost (USD) |",
            "| --- | --- | --- | ---: | ---: | --- | ---: |"]
    for call in calls:
        cost = "" if call.cost_usd is None else f"{call.cost_usd:.6f}"
        rows.append(f"| {call.turn_id or ''} | {call.provider}/{call.model} | {call.route_kind} | "
                    f"{call.input_tokens} | {call.output_tokens} | {call.tokens_source} | {cost} |")
    return rows
