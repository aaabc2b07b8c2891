"""The provider-facing chat history and its token estimate.

Pure: no I/O, no clock, no globals. A ``ChatMessage`` measures its own text once and keeps the
figure, so estimating a history costs one addition per message and a turn's work grows with the new
messages, not with the history.

Roles are ``system``, ``user``, ``assistant`` and ``tool`` (a tool result; each provider dialect
rewrites it to its own shape when sending). Estimate per message: ceil(UTF-8 bytes / 4) + 4, plus
``image_token_cost`` for each image that is actually sent: images on user messages, and images a
tool declared on results inside the current user turn. Older tool results count as their bytes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

BREADCRUMB_TEXT = "[earlier turns omitted to fit the context window]"
TOOL_RESULTS_PREFIX = "[Tool results]"
DEFAULT_IMAGE_TOKEN_COST = 1000
MESSAGE_OVERHEAD_TOKENS = 4
TRIMMED = "trimmed"  # the reason ``left_out`` gives for messages a whole-turn trim dropped


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Image:
    media_type: str
    data: str  # base64, as it came from the client


@dataclass(frozen=True)
class ServedBy:
    """On a reply: the route its provider call was sent to, as that call's ``route`` frame named it.
    Kept with the message, so a reply whose call never ended (stopped, failed, or cut short by a
    crash, when no call record is written) still says which model wrote it."""

    provider: str
    model: str
    route_kind: str
    hint: str | None = None

    def fields(self) -> dict[str, Any]:
        """``{provider, model, route_kind, hint?}``: a ``route`` frame's body, a reply's route."""
        body: dict[str, Any] = {"provider": self.provider, "model": self.model, "route_kind": self.route_kind}
        if self.hint is not None:
            body["hint"] = self.hint
        return body


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass(eq=False)
class ChatMessage:
    """One message of a session's transcript.

    ``left_out`` says why a message kept in the transcript is no longer sent (``TRIMMED`` for a
    whole-turn trim, or a set-aside or compaction reason); None means it is sent. ``breadcrumb`` and
    ``summary`` mark messages the runtime wrote itself.
    """

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    images: list[Image] | None = None
    name: str | None = None  # the tool's name on a tool result
    breadcrumb: bool = False
    summary: bool = False
    left_out: str | None = None
    interrupted: bool = False
    turn_id: str | None = None  # the user turn this message belongs to (set by the session)
    created_at: str | None = None  # ISO-8601 UTC, stamped by the session when it joins the transcript
    replaces: str | None = None  # on a user message: the turn it replaces (a retry, an edit)
    thinking: str | None = None  # on a reply: the model's reasoning as streamed (never sent back)
    served_by: ServedBy | None = None  # on a reply: the route of the call that wrote it
    id: str = field(default_factory=_new_id)
    _text_tokens: int | None = field(default=None, repr=False)

    @property
    def text_tokens(self) -> int:
        """Tokens of the text (and tool-call arguments) with the per-message overhead; measured once."""
        if self._text_tokens is None:
            self._text_tokens = _measure(self)
        return self._text_tokens

    def set_content(self, content: str) -> None:
        self.content = content
        self._text_tokens = None

    def set_tool_calls(self, calls: Sequence[ToolCall] | None) -> None:
        """Replace the tool calls (they count in the estimate, so the measure is taken again)."""
        self.tool_calls = list(calls) if calls else None
        self._text_tokens = None


def stored_marks(message: ChatMessage) -> tuple[bool, str | None]:
    """``left_out`` as the store, the exports and the wire spell it: a ``trimmed`` flag and an
    ``excluded`` reason (kept so stored sessions and the page read as before)."""
    if message.left_out == TRIMMED:
        return True, None
    return False, message.left_out


def left_out_from(trimmed: bool, excluded: str | None) -> str | None:
    """The inverse of ``stored_marks``."""
    return TRIMMED if trimmed else excluded


def _measure(message: ChatMessage) -> int:
    size = len(message.content.encode("utf-8"))
    for call in message.tool_calls or ():
        size += len(call.name.encode("utf-8"))
        size += len(json.dumps(call.arguments, ensure_ascii=False).encode("utf-8"))
    return -(-size // 4) + MESSAGE_OVERHEAD_TOKENS


def is_turn_start(message: ChatMessage) -> bool:
    """A turn starts at a real user message: not the breadcrumb, not a summary, not tool output."""
    if message.role != "user" or message.breadcrumb or message.summary:
        return False
    return not message.content.startswith(TOOL_RESULTS_PREFIX)


def current_turn_start(messages: Sequence[ChatMessage]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if is_turn_start(messages[index]):
            return index
    return len(messages)


def without_old_tool_images(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` as sent: images a tool declared go only with the current turn's results (older
    results are their text alone), the same rule the estimate counts by."""
    start = current_turn_start(messages)
    return [replace(m, images=None) if m.images and m.role == "tool" and i < start else m
            for i, m in enumerate(messages)]


def image_tokens(message: ChatMessage, *, in_current_turn: bool, image_token_cost: int) -> int:
    if not message.images:
        return 0
    # A user message carrying "[Tool results]" is tool output (XML dialect), not something the user sent.
    tool_output = message.role == "tool" or (
        message.role == "user" and message.content.startswith(TOOL_RESULTS_PREFIX))
    if tool_output:
        return len(message.images) * image_token_cost if in_current_turn else 0
    return len(message.images) * image_token_cost if message.role == "user" else 0


def estimate_history_tokens(
    messages: Sequence[ChatMessage], image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST
) -> int:
    """Estimated prompt tokens of ``messages`` as they would be sent."""
    total = 0
    turn_start = current_turn_start(messages)
    for index, message in enumerate(messages):
        total += message.text_tokens
        total += image_tokens(
            message, in_current_turn=index >= turn_start, image_token_cost=image_token_cost
        )
    return total


def old_turn_tokens(message: ChatMessage, image_token_cost: int) -> int:
    """A message's estimate as part of an earlier turn (tool-result images no longer count)."""
    images = image_tokens(message, in_current_turn=False, image_token_cost=image_token_cost)
    return message.text_tokens + images


def left_out_tokens(messages: Iterable[ChatMessage], image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> int:
    """Estimated tokens of messages no longer sent, each counted as in an old turn (so a sum that
    can grow message by message as trims leave more out)."""
    return sum(old_turn_tokens(m, image_token_cost) for m in messages)


def visible(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The messages that are still sent: everything not left out."""
    return [message for message in messages if message.left_out is None]
