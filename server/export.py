"""A stored session as a readable Markdown file or a versioned JSON document, and back from JSON.

JSON shape (``version`` 1)::

    {"format": "meterchat.session", "version": 1, "id", "title", "route", "created_at",
     "updated_at", "messages": [{id, role, content, tool_calls, tool_call_id, images, name,
     breadcrumb, summary, trimmed, excluded, interrupted, turn_id}], "calls": [{turn_id, provider,
     model, route_kind, input_tokens, output_tokens, tokens_source, cost_usd, created_at}]}

A message and a call are ``server.store``'s codec of ``ChatMessage`` and ``CallRecord``; what an
import accepts for each field is read from the same dataclasses (a field that may be None is
optional, one without a default is required, and every message names its ``id``).

``from_json`` checks every field and raises ``ImportRejected`` naming the first bad one
(``messages[3].role: ...``). It always gives the session a new id, so an import never overwrites.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, get_origin, get_type_hints

from server.errors import ImportRejected
from server.history import ChatMessage, stored_marks
from server.protocol import echo
from server.store import (
    MESSAGE_HINTS,
    MESSAGE_LISTS,
    CallRecord,
    StoredSession,
    call_to_data,
    message_from_data,
    message_to_data,
    type_options,
)

FORMAT = "meterchat.session"
VERSION = 1
ROLES = ("system", "user", "assistant", "tool")

_STR, _OPT_STR = (str,), (str, type(None))
_INT, _OPT_LIST = (int,), (list, type(None))
Fields = Mapping[str, tuple[tuple[type, ...], bool]]  # field -> (accepted types, required)


def _accepted(hint: Any) -> tuple[type, ...]:
    """The JSON types a field of this type hint accepts: ``list[X] | None`` is (list, NoneType),
    and a float accepts an integer."""
    kinds = tuple(get_origin(option) or option for option in type_options(hint))
    return (int, *kinds) if float in kinds else kinds


def _required(cls: type) -> set[str]:
    """Fields an import must give: no default, and None is not a value they take."""
    hints = get_type_hints(cls)
    return {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
            and type(None) not in type_options(hints[f.name])}


def _table(hints: Mapping[str, Any], required: set[str]) -> Fields:
    return {name: (_accepted(hint), name in required) for name, hint in hints.items()}


def _table_of(cls: type) -> Fields:
    return _table(get_type_hints(cls), _required(cls))


ECHO_KEY_CHARS = 100  # a field name quoted back in an error: an answer never grows with the input
_MESSAGE_FIELDS = _table(MESSAGE_HINTS, {"id"} | _required(ChatMessage))  # every message names its id
_TOOL_CALL_FIELDS = _table_of(MESSAGE_LISTS["tool_calls"])
_IMAGE_FIELDS = _table_of(MESSAGE_LISTS["images"])
_CALL_FIELDS = _table_of(CallRecord)
_SESSION_FIELDS: Fields = {
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
        raise ImportRejected(f"format: expected {FORMAT!r}, got {echo(data['format'])}")
    if data["version"] != VERSION:
        raise ImportRejected(f"version: this server reads version {VERSION}, got {str(data['version'])[:20]}")
    messages = [_message(item, f"messages[{i}]") for i, item in enumerate(data["messages"])]
    _check_unique_ids(messages)
    calls = [_call(item, f"calls[{i}]") for i, item in enumerate(data.get("calls") or [])]
    created = data.get("created_at") or ""
    return StoredSession(id=uuid.uuid4().hex, title=data["title"], route=data["route"],
                         created_at=created, updated_at=data.get("updated_at") or created,
                         messages=messages, calls=calls)


def _check_object(value: Any, path: str, fields: Fields) -> None:
    where = path or "document"
    if not isinstance(value, dict):
        raise ImportRejected(f"{where}: expected an object, got {_kind(value)}")
    for key in value:
        if key not in fields:
            raise ImportRejected(f"{_join(path, str(key)[:ECHO_KEY_CHARS])}: unknown field")
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
        raise ImportRejected(f"{path}.role: expected one of {', '.join(ROLES)}, got {echo(item['role'])}")
    for i, call in enumerate(item.get("tool_calls") or []):
        _check_object(call, f"{path}.tool_calls[{i}]", _TOOL_CALL_FIELDS)
    for i, image in enumerate(item.get("images") or []):
        _check_object(image, f"{path}.images[{i}]", _IMAGE_FIELDS)
    return message_from_data(item)


def _check_unique_ids(messages: list[ChatMessage]) -> None:
    seen: set[str] = set()
    for index, message in enumerate(messages):
        if message.id in seen:
            raise ImportRejected(f"messages[{index}].id: duplicate id {echo(message.id)}")
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
