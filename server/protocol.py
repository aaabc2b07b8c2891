"""Wire protocol v1: the JSON text frames of ``/ws``, their fields, parsing and validation.

``CLIENT_FRAMES`` and ``SERVER_FRAMES`` are the registry ``docs/protocol.md`` is checked against:
each maps a frame type to its fields, a trailing ``?`` marking an optional one. ``parse_client_frame``
turns raw text into a validated ``ClientFrame`` or raises ``BadFrame`` / ``UnknownFrameType``;
``server_frame`` builds a server frame and refuses fields the registry does not know, so the code
cannot drift from the document.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from server.errors import BadFrame, UnknownFrameType

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024

CLIENT_FRAMES: dict[str, tuple[str, ...]] = {
    "hello": ("session_id?", "last_seq?"),
    "message": ("id", "content", "images?", "retry_of?"),
    "switch_model": ("route",),
    "stop": (),
    "history_before": ("before_id", "limit?"),
}

SERVER_FRAMES: dict[str, tuple[str, ...]] = {
    "session": ("session_id", "resumed", "message_count", "route", "routes", "title", "protocol"),
    "history": ("messages", "older?"),
    "history_page": ("before_id", "messages", "older"),
    "accepted": ("id", "turn_id", "content", "images?"),
    "context": ("provider", "model", "route_kind", "estimated_tokens", "tokens_source",
                "context_token_budget", "model_context_window?", "window_source?", "trim_preview?",
                "reason", "system_tokens?", "tool_schema_tokens?", "history_tokens?", "trimmed_tokens?",
                "image_tokens?", "reply_reserve?", "calibration_ratio?", "tool_servers?"),
    "route": ("provider", "model", "route_kind", "hint?", "turn_id?"),
    "chunk": ("turn_id", "content"),
    "thinking": ("turn_id", "content"),
    "tool_call": ("turn_id", "id", "name", "args"),
    "tool_result": ("turn_id", "id", "name", "output"),
    "history_trimmed": ("dropped_messages", "dropped_turns", "kept_turns", "reason", "token_budget?",
                        "tokens_before?", "tokens_after?", "message_ids", "turn_ids", "turn_id?"),
    "done": ("turn_id", "full_response", "input_tokens", "output_tokens", "last_input_tokens", "provider",
             "model", "max_context_tokens", "model_context_window?", "cost_usd?", "calls?"),
    "aborted": ("turn_id",),
    "error": ("code", "message", "retryable", "turn_id?", "message_id?", "retry_after?"),
    "title": ("title",),
    "notice": ("code", "message", "turn_id?"),
}

CONTEXT_REASONS = ("hello", "switch", "hint", "send", "trim", "usage", "done", "restore", "count")
TRIM_REASONS = ("token_budget", "turn_limit", "overflow_recovery", "compaction")
NOTICE_CODES = ("provider_truncated", "reply_truncated", "store_recovered", "window_learned", "unknown_hint",
                "unknown_route")
# Enumerated fields are checked when a frame is built: a new value must be added here (and in the doc).
ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("context", "reason"): CONTEXT_REASONS,
    ("history_trimmed", "reason"): TRIM_REASONS,
    ("notice", "code"): NOTICE_CODES,
}

# What a reload restores and what versions need (issue 10 item 3, issue 12), added to v1 as optional
# fields and two frames; kept apart from the tables above so edits to those merge cleanly.
CLIENT_FRAMES["message"] += ("edit_of?",)
CLIENT_FRAMES["preview_edit"] = ("turn_id",)
SERVER_FRAMES["history"] += ("trims?", "turn_in_flight?", "notices?")
SERVER_FRAMES["accepted"] += ("retry_of?", "edit_of?", "created_at?", "image_urls?")
SERVER_FRAMES["done"] += ("created_at?",)
SERVER_FRAMES["route"] += ("created_at?",)  # when the call began: the reply's time (live and reloaded)
SERVER_FRAMES["turns_set_aside"] = ("turn_ids", "reason")
SERVER_FRAMES["budget"] = ("tokens_left", "daily_tokens", "resets_at")  # accounts: today's tokens (issue 19)
EDIT_PREVIEW = "edit_preview"  # a context frame answering preview_edit, for the asking client only
ENUMS[("context", "reason")] = (*CONTEXT_REASONS, EDIT_PREVIEW)
# MCP tools (issue 18): which server a call went to, what its result cost, what was cut.
SERVER_FRAMES["tool_call"] += ("server?",)
SERVER_FRAMES["tool_result"] += ("server?", "is_error?", "tokens?", "truncated_chars?")
ENUMS[("notice", "code")] = (*NOTICE_CODES, "tools_unavailable")
# Approval of a call whose tool says approve = "always": asked, answered (allow once or deny), settled.
SERVER_FRAMES["tool_approval"] = ("turn_id", "id", "name", "server", "args")
SERVER_FRAMES["tool_decided"] = ("turn_id", "id", "allow")
SERVER_FRAMES["history"] += ("approvals?",)
CLIENT_FRAMES["tool_decision"] = ("turn_id", "id", "allow")


@dataclass(frozen=True)
class ImagePayload:
    media_type: str
    data: str


@dataclass(frozen=True)
class ClientFrame:
    type: str
    fields: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


ID_CHARS = 200  # session, message and turn ids are short; a longer one is no id of ours
ROUTE_CHARS = 200
MEDIA_TYPE_CHARS = 100
MAX_SEQ = 2**53 - 1  # the largest integer a JavaScript client holds exactly
ECHO_CHARS = 200
_SURROGATE = re.compile("[\ud800-\udfff]")
# "/model ROUTE" and "/hint NAME" in a message's content name a route the same way switch_model does;
# the hub and the resolver quote them back (UnknownRoute, the route frame's hint), so they share its
# bound here.
_HINT = re.compile(r"/hint[ \t]+(\S+)")


def echo(value: Any) -> str:
    """A client value as an error message may quote it: valid text, cut to ``ECHO_CHARS``, so an
    answer never grows with the input (a non-string is named by its JSON type only)."""
    if not isinstance(value, str):
        return _json_type(value)
    text = repr(value[:ECHO_CHARS])  # escapes make a repr longer than its text: cut both
    if len(value) <= ECHO_CHARS and len(text) <= ECHO_CHARS + 2:
        return text
    return text[:ECHO_CHARS] + "..."


def _json_type(value: Any) -> str:
    names = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
             (list, "an array"), (dict, "an object"))
    return next((name for kind, name in names if isinstance(value, kind)), "null")


def valid_text(text: str) -> str:
    """``text`` with lone surrogates (legal in JSON escapes, unencodable in UTF-8) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _require(frame: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = frame.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadFrame(f"{frame['type']}.{name}: expected {what}, got {echo(value)}")
    return value


def _require_id(frame: dict[str, Any], name: str, what: str = "an id string") -> str:
    """An id is matched exactly against stored ones: refused, not repaired, when it cannot be one."""
    value: str = _require(frame, name, str, what)
    if not value or len(value) > ID_CHARS:
        raise BadFrame(f"{frame['type']}.{name}: expected 1 to {ID_CHARS} characters, got {len(value)}")
    if _SURROGATE.search(value):
        raise BadFrame(f"{frame['type']}.{name}: contains a lone surrogate, which no id has")
    return value


def _require_short(frame: dict[str, Any], name: str, limit: int, what: str) -> str:
    value: str = valid_text(_require(frame, name, str, what))
    if len(value) > limit:
        raise BadFrame(f"{frame['type']}.{name}: expected at most {limit} characters, got {len(value)}")
    return value


def _check_images(frame: dict[str, Any]) -> list[ImagePayload]:
    images = frame.get("images")
    if images is None:
        return []
    if not isinstance(images, list):
        raise BadFrame(f"message.images: expected a list of {{media_type, data}}, got {echo(images)}")
    parsed = []
    for index, image in enumerate(images):
        if not isinstance(image, dict) or not isinstance(image.get("media_type"), str) \
                or not isinstance(image.get("data"), str):
            raise BadFrame(f"message.images[{index}]: expected {{media_type: str, data: base64 str}}")
        if len(image["media_type"]) > MEDIA_TYPE_CHARS:
            raise BadFrame(f"message.images[{index}].media_type: longer than {MEDIA_TYPE_CHARS} characters")
        parsed.append(ImagePayload(valid_text(image["media_type"]), valid_text(image["data"])))
    return parsed


def _validate_hello(frame: dict[str, Any]) -> None:
    if frame.get("session_id"):  # absent, null or "" all ask for a new session
        _require_id(frame, "session_id", "a session id string")
    if frame.get("last_seq") is not None:
        seq = _require(frame, "last_seq", int, "an integer")
        if not 0 <= seq <= MAX_SEQ:
            raise BadFrame(f"hello.last_seq: expected 0 to {MAX_SEQ}")


def _validate_message(frame: dict[str, Any]) -> None:
    _require_id(frame, "id", "a string")
    frame["content"] = valid_text(_require(frame, "content", str, "a string"))
    frame["images"] = _check_images(frame)
    if frame.get("retry_of") is not None:
        _require_id(frame, "retry_of", "the turn_id of a failed turn")
    if not frame["content"].strip() and not frame["images"]:
        raise BadFrame("message.content: empty message")
    _check_commands(frame["content"])


def _check_commands(content: str) -> None:
    head, _, route = content.strip().partition(" ")
    hint = _HINT.match(content)
    if head == "/model" and len(route) > ROUTE_CHARS or hint and len(hint.group(1)) > ROUTE_CHARS:
        raise BadFrame(f"message.content: a /model route or /hint name is over {ROUTE_CHARS} characters")


def _validate(frame: dict[str, Any]) -> dict[str, Any]:
    kind = frame["type"]
    if kind == "hello":
        _validate_hello(frame)
    elif kind == "message":
        _validate_message(frame)
    elif kind == "switch_model":
        frame["route"] = _require_short(frame, "route", ROUTE_CHARS,
                                        "a route string like 'provider' or 'provider/model'")
    elif kind == "history_before":
        _validate_history_before(frame)
    elif kind == "tool_decision":
        _require_id(frame, "turn_id", "the turn_id of the call")
        _require_id(frame, "id", "the id of the call")
        _require(frame, "allow", bool, "true (allow once) or false (deny)")
    # Unknown fields are ignored (protocol rule), so they are not kept either.
    required, optional = field_names(CLIENT_FRAMES[kind])
    return {name: frame[name] for name in required | optional if name in frame}


def _validate_history_before(frame: dict[str, Any]) -> None:
    _require_id(frame, "before_id", "the id of the oldest message the client holds")
    if frame.get("limit") is not None:
        limit = _require(frame, "limit", int, "a number of messages")
        if limit < 1:
            raise BadFrame(f"history_before.limit: expected 1 or more, got {limit}")


def _no_constant(name: str) -> Any:
    raise BadFrame(f"malformed JSON: {name} is not a JSON number")


def _decode(text: str) -> Any:
    """``json.loads`` with every failure as ``BadFrame``: besides syntax, Python refuses nesting
    deeper than its recursion limit and integers over 4,300 digits with other exceptions."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadFrame(f"malformed JSON: {exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise BadFrame("malformed JSON: nested too deeply") from exc
    except ValueError as exc:  # int_max_str_digits
        raise BadFrame("malformed JSON: a number too long to read") from exc


def parse_client_frame(text: str | bytes) -> ClientFrame:
    """A validated frame, or ``BadFrame`` / ``UnknownFrameType``: nothing else escapes, whatever
    the text. Strings a frame carries are valid text (lone surrogates as U+FFFD; ids refused)."""
    if isinstance(text, bytes):
        raise BadFrame("binary frames are not part of protocol v1; send JSON text frames")
    data = _decode(text)
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise BadFrame(f'every frame is a JSON object with a string "type", got {echo(data)}')
    if data["type"] not in CLIENT_FRAMES:
        raise UnknownFrameType(
            f"unknown frame type {echo(data['type'])}; expected one of {', '.join(CLIENT_FRAMES)}"
        )
    fields = _validate(data)
    return ClientFrame(data["type"], fields)


@functools.cache  # a frame type's spec is a constant tuple: read once, not for every frame sent
def field_names(spec: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    required = frozenset(name for name in spec if not name.endswith("?"))
    optional = frozenset(name[:-1] for name in spec if name.endswith("?"))
    return required, optional


def server_frame(kind: str, **fields: Any) -> dict[str, Any]:
    """A server frame with its fields checked against the registry; ``None`` optionals are left out."""
    spec = SERVER_FRAMES.get(kind)
    if spec is None:
        raise ValueError(f"unknown server frame type {kind!r}")
    required, optional = field_names(spec)
    fields = {k: v for k, v in fields.items() if not (k in optional and v is None)}
    missing = required - fields.keys()
    unknown = fields.keys() - required - optional
    if missing or unknown:
        raise ValueError(f"{kind} frame: missing {sorted(missing)}, unknown {sorted(unknown)}")
    for (frame_kind, name), allowed in ENUMS.items():
        if frame_kind == kind and fields[name] not in allowed:
            raise ValueError(f"{kind}.{name}: {fields[name]!r} is not one of {', '.join(allowed)}")
    return {"type": kind, **fields}
