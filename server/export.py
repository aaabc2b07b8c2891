"""A stored session as a readable Markdown file or a versioned JSON document, and back from JSON.

JSON shape (``version`` 1)::

    {"format": "meterchat.session", "version": 1, "id", "title", "route", "created_at",
     "updated_at", "messages": [{id, role, content, tool_calls, tool_call_id, images, name,
     breadcrumb, summary, trimmed, excluded, interrupted, turn_id}], "calls": [{turn_id, provider,
     model, route_kind, input_tokens, output_tokens, tokens_source, cost_usd, created_at}]}

``from_json`` checks every field and raises ``ImportRejected`` naming the first bad one
(``messages[3].role: ...``). It always gives the session a new id, so an import never overwrites.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from server.errors import ImportRejected
from server.history import ChatMessage, stored_marks
from server.store import CallRecord, StoredSession, call_to_data, message_from_data, message_to_data

FORMAT = "meterchat.session"
VERSION = 1
ROLES = ("system", "user", "assistant", "tool")

_STR, _OPT_STR = (str,), (str, type(None))
_BOOL, _INT, _OPT_NUM = (bool,), (int,), (int, float, type(None))
_OPT_LIST = (list, type(None))
# field -> (accepted types, required)
_MESSAGE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": (_STR, True), "role": (_STR, True), "content": (_STR, True),
    "tool_calls": (_OPT_LIST, False), "tool_call_id": (_OPT_STR, False), "images": (_OPT_LIST, False),
    "name": (_OPT_STR, False), "breadcrumb": (_BOOL, False), "summary": (_BOOL, False),
    "trimmed": (_BOOL, False), "excluded": (_OPT_STR, False), "interrupted": (_BOOL, False),
    "turn_id": (_OPT_STR, False),
}
_TOOL_CALL_FIELDS = {"id": (_STR, True), "name": (_STR, True), "arguments": ((dict,), True)}
_IMAGE_FIELDS = {"media_type": (_STR, True), "data": (_STR, True)}
_CALL_FIELDS = {
    "turn_id": (_OPT_STR, False), "provider": (_STR, True), "model": (_STR, True),
    "route_kind": (_STR, True), "input_tokens": (_INT, True), "output_tokens": (_INT, True),
    "tokens_source": (_STR, True), "cost_usd": (_OPT_NUM, False), "created_at": (_OPT_STR, False),
}
_SESSION_FIELDS = {
    "format": (_STR, True), "version": (_INT, True), "id": (_OPT_STR, False), "title": (_STR, True),
    "route": (_STR, True), "created_at": (_OPT_STR, False), "updated_at": (_OPT_STR, False),
    "messages": ((list,), True), "calls": (_OPT_LIST, False),
}


def to_json(session: StoredSession) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": VERSION, "id": session.id, "title": session.title,
        "route": session.route, "created_at": session.created_at, "updated_at": session.updated_at,
        "messages": [message_to_data(message) for message in session.messages],
        "calls": [call_to_data(call) for call in session.calls],
    }


def from_json(data: Any) -> StoredSession:
    """A new session (fresh id) from an exported document; ``ImportRejected`` names a bad field."""
    _check_object(data, "", _SESSION_FIELDS)
    if data["format"] != FORMAT:
        raise ImportRejected(f"format: expected {FORMAT!r}, got {data['format']!r}")
    if data["version"] != VERSION:
        raise ImportRejected(f"version: this server reads version {VERSION}, got {data['version']!r}")
    messages = [_message(item, f"messages[{i}]") for i, item in enumerate(data["messages"])]
    _check_unique_ids(messages)
    calls = [_call(item, f"calls[{i}]") for i, item in enumerate(data.get("calls") or [])]
    created = data.get("created_at") or ""
    return StoredSession(id=uuid.uuid4().hex, title=data["title"], route=data["route"],
                         created_at=created, updated_at=data.get("updated_at") or created,
                         messages=messages, calls=calls)


def _check_object(value: Any, path: str, fields: Mapping[str, tuple[tuple[type, ...], bool]]) -> None:
    where = path or "document"
    if not isinstance(value, dict):
        raise ImportRejected(f"{where}: expected an object, got {_kind(value)}")
    for key in value:
        if key not in fields:
            raise ImportRejected(f"{_join(path, str(key))}: unknown field")
    for key, (types, required) in fields.items():
        if key not in value:
            if required:
                raise ImportRejected(f"{_join(path, key)}: required")
            continue
        item = value[key]
        # bool is an int in Python; a JSON true must not pass for a token count, nor 1 for a flag.
        if not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
            names = " or ".join(_type_name(t) for t in types)
            raise ImportRejected(f"{_join(path, key)}: expected {names}, got {_kind(item)}")


def _message(item: Any, path: str) -> ChatMessage:
    _check_object(item, path, _MESSAGE_FIELDS)
    if item["role"] not in ROLES:
        raise ImportRejected(f"{path}.role: expected one of {', '.join(ROLES)}, got {item['role']!r}")
    for i, call in enumerate(item.get("tool_calls") or []):
        _check_object(call, f"{path}.tool_calls[{i}]", _TOOL_CALL_FIELDS)
    for i, image in enumerate(item.get("images") or []):
        _check_object(image, f"{path}.images[{i}]", _IMAGE_FIELDS)
    return message_from_data(item)


def _check_unique_ids(messages: list[ChatMessage]) -> None:
    seen: set[str] = set()
    for index, message in enumerate(messages):
        if message.id in seen:
            raise ImportRejected(f"messages[{index}].id: duplicate id {message.id!r}")
        seen.add(message.id)


def _call(item: Any, path: str) -> CallRecord:
    _check_object(item, path, _CALL_FIELDS)
    for key in ("input_tokens", "output_tokens"):
        if item[key] < 0:
            raise ImportRejected(f"{path}.{key}: expected a count of 0 or more, got {item[key]}")
    values = {key: item.get(key) for key in _CALL_FIELDS}
    if values["cost_usd"] is not None:
        values["cost_usd"] = float(values["cost_usd"])
    return CallRecord(**values)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_JSON_NAMES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
               dict: "object", type(None): "null"}


def _type_name(kind: type) -> str:
    return _JSON_NAMES.get(kind, kind.__name__)


def _kind(value: Any) -> str:
    return _type_name(type(value))


# Markdown

def to_markdown(session: StoredSession) -> str:
    """A readable transcript: head, every message with its role and marks, then the calls."""
    parts = [f"# {session.title or 'Untitled session'}", "",
             f"- Route: `{session.route}`", f"- Created: {session.created_at}",
             f"- Updated: {session.updated_at}", f"- Session: `{session.id}`", ""]
    for index, message in enumerate(session.messages, 1):
        parts.extend(["---", "", _message_heading(index, message), ""])
        parts.extend(_message_body(message))
    if session.calls:
        parts.extend(["---", "", "## Provider calls", "", *_calls_table(session.calls), ""])
    return "\n".join(parts).rstrip("\n") + "\n"


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
