"""Wire protocol v1: the JSON text frames of ``/ws``, their fields, parsing and validation.

``CLIENT_FRAMES`` and ``SERVER_FRAMES`` are the registry ``docs/protocol.md`` is checked against:
each maps a frame type to its fields, a trailing ``?`` marking an optional one. ``parse_client_frame``
turns raw text into a validated ``ClientFrame`` or raises ``BadFrame`` / ``UnknownFrameType``;
``server_frame`` builds a server frame and refuses fields the registry does not know, so the code
cannot drift from the document.
"""

from __future__ import annotations

import json
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
                "reason"),
    "route": ("provider", "model", "route_kind", "hint?", "turn_id?"),
    "chunk": ("turn_id", "content"),
    "thinking": ("turn_id", "content"),
    "tool_call": ("turn_id", "id", "name", "args"),
    "tool_result": ("turn_id", "id", "name", "output"),
    "history_trimmed": ("dropped_messages", "dropped_turns", "kept_turns", "reason", "token_budget?",
                        "tokens_before?", "tokens_after?", "message_ids", "turn_ids", "turn_id?"),
    "done": ("turn_id", "full_response", "input_tokens", "output_tokens", "last_input_tokens", "provider",
             "model", "max_context_tokens", "model_context_window?", "cost_usd?"),
    "aborted": ("turn_id",),
    "error": ("code", "message", "retryable", "turn_id?", "message_id?", "retry_after?"),
    "title": ("title",),
    "notice": ("code", "message", "turn_id?"),
}

CONTEXT_REASONS = ("hello", "switch", "hint", "send", "trim", "usage", "done", "restore")
TRIM_REASONS = ("token_budget", "turn_limit", "overflow_recovery", "compaction")
NOTICE_CODES = ("provider_truncated", "reply_truncated", "store_recovered")
# Enumerated fields are checked when a frame is built: a new value must be added here (and in the doc).
ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("context", "reason"): CONTEXT_REASONS,
    ("history_trimmed", "reason"): TRIM_REASONS,
    ("notice", "code"): NOTICE_CODES,
}


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


def _require(frame: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = frame.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadFrame(f"{frame['type']}.{name}: expected {what}, got {json.dumps(value)[:80]}")
    return value


def _check_images(frame: dict[str, Any]) -> list[ImagePayload]:
    images = frame.get("images")
    if images is None:
        return []
    if not isinstance(images, list):
        raise BadFrame("message.images: expected a list of {media_type, data}")
    parsed = []
    for index, image in enumerate(images):
        if not isinstance(image, dict) or not isinstance(image.get("media_type"), str) \
                or not isinstance(image.get("data"), str):
            raise BadFrame(f"message.images[{index}]: expected {{media_type: str, data: base64 str}}")
        parsed.append(ImagePayload(image["media_type"], image["data"]))
    return parsed


def _validate(frame: dict[str, Any]) -> dict[str, Any]:
    kind = frame["type"]
    if kind == "hello":
        if frame.get("session_id") is not None:
            _require(frame, "session_id", str, "a string")
        if frame.get("last_seq") is not None:
            _require(frame, "last_seq", int, "an integer")
    elif kind == "message":
        _require(frame, "id", str, "a string")
        _require(frame, "content", str, "a string")
        frame["images"] = _check_images(frame)
        if frame.get("retry_of") is not None:
            _require(frame, "retry_of", str, "the turn_id of a failed turn")
        if not frame["content"].strip() and not frame["images"]:
            raise BadFrame("message.content: empty message")
    elif kind == "switch_model":
        _require(frame, "route", str, "a route string like 'provider' or 'provider/model'")
    elif kind == "history_before":
        _require(frame, "before_id", str, "the id of the oldest message the client holds")
        if frame.get("limit") is not None:
            _require(frame, "limit", int, "a number of messages")
    return frame


def parse_client_frame(text: str | bytes) -> ClientFrame:
    if isinstance(text, bytes):
        raise BadFrame("binary frames are not part of protocol v1; send JSON text frames")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadFrame(f"malformed JSON: {exc.msg} at position {exc.pos}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise BadFrame('every frame is a JSON object with a string "type"')
    if data["type"] not in CLIENT_FRAMES:
        raise UnknownFrameType(
            f"unknown frame type {data['type']!r}; expected one of {', '.join(CLIENT_FRAMES)}"
        )
    fields = _validate(data)
    return ClientFrame(data["type"], {k: v for k, v in fields.items() if k != "type"})


def field_names(spec: tuple[str, ...]) -> tuple[set[str], set[str]]:
    required = {name for name in spec if not name.endswith("?")}
    optional = {name[:-1] for name in spec if name.endswith("?")}
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
