"""A stored session as a versioned JSON document, and back (``server.web.markdown`` writes the readable
Markdown file).

JSON shape (``version`` 1)::

    {"format": "meterchat.session", "version": 1, "id", "title", "route", "created_at",
     "updated_at", "messages": [{id, role, content, tool_calls, tool_call_id, images, name,
     breadcrumb, summary, trimmed, excluded, interrupted, turn_id, created_at?, replaces?,
     thinking?, served_by?: {provider, model, route_kind, hint}}], "calls": [{turn_id, provider,
     model, route_kind, input_tokens, output_tokens, tokens_source, cost_usd, created_at}],
     "trims": [{history_trimmed fields, created_at, after_message_id?}],
     "notices": [{type, the frame's fields, created_at, after_message_id}]}

``trims`` and ``notices`` (added to version 1; a file without them still reads) are the transcript's
other lines as the ``history`` frame gives them, so an imported session reloads with its trim notices,
errors, switches and notices where they happened. Each is checked against ``LINE_FIELDS`` (every
field's JSON type) and the frame registry (which fields each kind needs), so the page never draws a
line it does not understand.

A message and a call are ``server.store.base``'s codec of ``ChatMessage`` and ``CallRecord``; what an
import accepts for each field is read from the same dataclasses (a field that may be None is
optional, one without a default is required, and every message names its ``id``).

``from_json`` checks every field and raises ``ImportRejected`` naming the first bad one
(``messages[3].role: ...``). It always gives the session a new id, so an import never overwrites.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, get_origin, get_type_hints

from server.errors import ImportRejected
from server.history.messages import ChatMessage
from server.protocol import NOTICE_CODES, SERVER_FRAMES, TRIM_REASONS, echo, field_names
from server.store.base import (
    MESSAGE_HINTS,
    MESSAGE_LISTS,
    MESSAGE_OBJECTS,
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
    """The JSON types a field of this type hint accepts: ``list[X] | None`` is (list, NoneType), a
    dataclass is an object (dict), and a float accepts an integer."""
    kinds = tuple(dict if is_dataclass(option) else get_origin(option) or option
                  for option in type_options(hint))
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
_SERVED_FIELDS = _table_of(MESSAGE_OBJECTS["served_by"])
_CALL_FIELDS = _table_of(CallRecord)
_SESSION_FIELDS: Fields = {
    "format": (_STR, True), "version": (_INT, True), "id": (_OPT_STR, False), "title": (_STR, True),
    "route": (_STR, True), "created_at": (_OPT_STR, False), "updated_at": (_OPT_STR, False),
    "messages": ((list,), True), "calls": (_OPT_LIST, False), "trims": (_OPT_LIST, False),
    "notices": (_OPT_LIST, False),
}


def to_json(session: StoredSession) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": VERSION, "id": session.id, "title": session.title,
        "route": session.route, "created_at": session.created_at, "updated_at": session.updated_at,
        "messages": [message_to_data(message) for message in session.messages],
        "calls": [call_to_data(call) for call in session.calls],
        "trims": list(session.trims), "notices": list(session.notices),
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
    trims = [_trim(item, f"trims[{i}]") for i, item in enumerate(data.get("trims") or [])]
    notices = [_notice(item, f"notices[{i}]") for i, item in enumerate(data.get("notices") or [])]
    created = data.get("created_at") or ""
    return StoredSession(id=uuid.uuid4().hex, title=data["title"], route=data["route"],
                         created_at=created, updated_at=data.get("updated_at") or created,
                         messages=messages, calls=calls, trims=trims, notices=notices)


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
    if item.get("served_by") is not None:
        _check_object(item["served_by"], f"{path}.served_by", _SERVED_FIELDS)
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


# Transcript lines: every field a kept trim or notice may carry, by name, with its JSON types.
_NUMBER = (int, float)
_STR_FIELDS = ("code", "message", "turn_id", "message_id", "provider", "model", "route_kind", "hint",
               "reason", "tokens_source", "window_source", "content", "created_at")
_INT_FIELDS = ("dropped_messages", "dropped_turns", "kept_turns", "token_budget", "tokens_before",
               "tokens_after", "estimated_tokens", "context_token_budget", "model_context_window",
               "system_tokens", "tool_schema_tokens", "history_tokens", "trimmed_tokens", "image_tokens",
               "reply_reserve")
LINE_FIELDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(_STR_FIELDS, _STR), **dict.fromkeys(_INT_FIELDS, _INT),
    "retry_after": _NUMBER, "calibration_ratio": _NUMBER, "retryable": (bool,),
    "message_ids": (list,), "turn_ids": (list,), "after_message_id": _OPT_STR,
    "route": (dict,), "trim_preview": (dict,), "tool_servers": (dict,),
}
_ROUTE_FIELDS: Fields = {"provider": (_STR, True), "model": (_STR, True), "route_kind": (_STR, True),
                         "hint": (_OPT_STR, False), "turn_id": (_OPT_STR, False), "created_at": (_STR, False)}
_PREVIEW_FIELDS: Fields = {"turns": (_INT, True), "tokens": (_INT, True)}


def _line_fields(spec: tuple[str, ...], *extra: str) -> Fields:
    """A kept line's fields: its frame's (required as the registry says), when it happened and
    after which message."""
    required, optional = field_names(spec)
    names = {**dict.fromkeys((*optional, "after_message_id", *extra), False),
             **dict.fromkeys((*required, "created_at"), True)}
    return {name: (LINE_FIELDS[name], needed) for name, needed in names.items()}


_TRIM_FIELDS = _line_fields(SERVER_FRAMES["history_trimmed"])
# The kinds of notice the page draws again (``server.sessions.notices``), each with its fields; a turn's
# error and a stop carry the turn's route.
_NOTICE_FIELDS: dict[str, Fields] = {
    kind: {"type": (_STR, True), **_line_fields(spec, "route")}
    for kind, spec in (*((k, SERVER_FRAMES[k]) for k in ("error", "notice", "context", "route", "aborted")),
                       ("command", ("content",)))
}


def _trim(item: Any, path: str) -> dict[str, Any]:
    _check_object(item, path, _TRIM_FIELDS)
    _check_enum(item, path, "reason", TRIM_REASONS)
    for key in ("message_ids", "turn_ids"):
        _check_strings(item[key], f"{path}.{key}")
    return dict(item)


def _notice(item: Any, path: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ImportRejected(f"{path}: expected an object, got {_kind(item)}")
    kind = item.get("type")
    if kind not in _NOTICE_FIELDS:
        raise ImportRejected(f"{path}.type: expected one of {', '.join(_NOTICE_FIELDS)}, got {echo(kind)}")
    _check_object(item, path, _NOTICE_FIELDS[kind])
    if kind == "notice":
        _check_enum(item, path, "code", NOTICE_CODES)
    if kind == "context":
        _check_enum(item, path, "reason", ("switch",))
    if isinstance(item.get("route"), dict):
        _check_object(item["route"], f"{path}.route", _ROUTE_FIELDS)
    if isinstance(item.get("trim_preview"), dict):
        _check_object(item["trim_preview"], f"{path}.trim_preview", _PREVIEW_FIELDS)
    return dict(item)


def _check_enum(item: Mapping[str, Any], path: str, key: str, allowed: tuple[str, ...]) -> None:
    if item[key] not in allowed:
        raise ImportRejected(f"{path}.{key}: expected one of {', '.join(allowed)}, got {echo(item[key])}")


def _check_strings(values: list[Any], path: str) -> None:
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise ImportRejected(f"{path}[{index}]: expected string, got {_kind(value)}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_JSON_NAMES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
               dict: "object", type(None): "null"}


def _type_name(kind: type) -> str:
    return _JSON_NAMES.get(kind, kind.__name__)


def _kind(value: Any) -> str:
    return _type_name(type(value))
