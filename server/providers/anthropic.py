"""Anthropic Messages API, streamed as Server-Sent Events.

Wire format: ``POST {base_url}/v1/messages`` with ``x-api-key``, ``anthropic-version: 2023-06-01``,
top-level ``system`` and ``max_tokens`` (request.max_output_tokens or 1024). Tool results travel as
``tool_result`` blocks in a user message (consecutive ones merged), assistant calls as ``tool_use``
blocks, images as base64 ``image`` blocks; consecutive same-role messages are merged into one.

Events in: ``message_start`` (usage: input = input_tokens + cache_creation_input_tokens +
cache_read_input_tokens), ``content_block_start/delta/stop`` (text_delta, thinking_delta,
input_json_delta joined and parsed at block stop), ``message_delta`` (cumulative output_tokens,
stop_reason), ``message_stop``; ``ping`` and unknown types are ignored; an ``error`` event after
HTTP 200 is translated (overloaded_error -> Overloaded, ...). Out: deltas and tool calls as they
complete, then one Usage and Finish at ``message_stop``. No window discovery (None). Counts
(``count_endpoint``): ``POST /v1/messages/count_tokens`` (``counts.py``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from server.errors import ProtocolError
from server.history.messages import ChatMessage
from server.providers import _http
from server.providers.base import (
    Finish,
    ProviderRequest,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    TokenCount,
    ToolCallEvent,
    Usage,
    WindowInfo,
)
from server.providers.budget import ReplyBudget
from server.providers.counts import anthropic_count
from server.providers.decoders import SSEDecoder, SSEEvent
from server.providers.translate import translate_error

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024
_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _image_block(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        content: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
        content += [_image_block(i.media_type, i.data) for i in message.images or ()]
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": content}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    blocks += [_image_block(i.media_type, i.data) for i in message.images or ()]
    for call in message.tool_calls or ():
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
    return blocks


def wire_messages(messages: Sequence[ChatMessage]) -> tuple[str, list[dict[str, Any]]]:
    """(system text, messages). Tool results become user messages; same-role neighbours merge."""
    system = [m.content for m in messages if m.role == "system" and m.left_out is None]
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.left_out is not None or message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"] += blocks
        else:
            wire.append({"role": role, "content": blocks})
    return "\n\n".join(system), wire


def request_body(request: ProviderRequest) -> dict[str, Any]:
    system, messages = wire_messages(request.messages)
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_output_tokens or DEFAULT_MAX_TOKENS,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                         for t in request.tools]
    return body


@dataclass
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    json_parts: list[str] = field(default_factory=list)
    size: int = 0  # characters of input JSON so far


@dataclass
class _StreamState:
    alias: str
    budget: ReplyBudget
    blocks: dict[int, _Block] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    reason: str | None = None
    model: str | None = None
    done: bool = False

    def handle(self, event: SSEEvent) -> list[StreamEvent]:
        try:
            payload = event.json()
        except ValueError as exc:
            raise ProtocolError(f"{self.alias}: HTTP 200, then an event that is not JSON: "
                                f"{event.data[:200]!r}") from exc
        if not isinstance(payload, dict):
            raise ProtocolError(f"{self.alias}: HTTP 200, then an event that is not an object")
        kind = payload.get("type") or event.event
        if kind == "error":
            raise translate_error(self.alias, None, payload)
        handler = getattr(self, f"_on_{kind}", None)
        # Unknown event types are skipped: Anthropic's versioning policy adds new ones freely.
        return handler(payload) if handler is not None else []

    def _on_message_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        message = payload.get("message") or {}
        self.model = message.get("model") or self.model
        self._add_usage(message.get("usage"))
        return []

    def _on_content_block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        block = payload.get("content_block") or {}
        kind = block.get("type", "")
        index = payload.get("index", 0)
        if index not in self.blocks:  # a block's bookkeeping counts, so endless empty blocks end too
            self.budget.call(str(block.get("name") or ""), str(block.get("id") or ""))
        self.blocks[index] = _Block(kind, block.get("id", ""), block.get("name", ""))
        if kind == "text" and block.get("text"):
            return [TextDelta(block["text"])]
        if kind == "thinking" and block.get("thinking"):
            return [ThinkingDelta(block["thinking"])]
        return []

    def _on_content_block_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        delta = payload.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [TextDelta(delta["text"])]
        if kind == "thinking_delta" and delta.get("thinking"):
            return [ThinkingDelta(delta["thinking"])]
        if kind == "input_json_delta":
            index = payload.get("index", 0)
            block = self.blocks.get(index)
            if block is None:
                block = self.blocks[index] = _Block("tool_use")
                self.budget.call("")
            piece = delta.get("partial_json") or ""
            block.size += len(piece)
            self.budget.arguments(block.name, block.size, len(piece))
            block.json_parts.append(piece)
        return []

    def _on_content_block_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        block = self.blocks.pop(payload.get("index", 0), None)
        if block is None or block.kind != "tool_use":
            return []
        arguments = _http.tool_arguments(self.alias, block.name, block.json_parts)
        return [ToolCallEvent(block.id, block.name, arguments)]

    def _on_message_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        reason = (payload.get("delta") or {}).get("stop_reason")
        if reason:
            self.reason = _REASONS.get(reason, reason)
        self._add_usage(payload.get("usage"))
        return []

    def _on_message_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self.done = True
        out: list[StreamEvent] = []
        if self.usage:
            inputs = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            out.append(Usage(sum(self.usage.get(k, 0) for k in inputs), self.usage.get("output_tokens", 0)))
        out.append(Finish(self.reason or "stop", self.model))
        return out

    def _add_usage(self, usage: Any) -> None:
        # message_delta counts are cumulative, so a later figure replaces the earlier one.
        if isinstance(usage, dict):
            self.usage.update({k: v for k, v in usage.items() if isinstance(v, int)})


class AnthropicProvider(_http.HttpProvider):
    kind = "anthropic"
    _no_count = False  # the count endpoint answered 404

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self.profile.api_key:
            headers["x-api-key"] = self.profile.api_key
        return headers

    def stream(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        alias = self.profile.alias
        return self._run("/v1/messages", request_body(request),
                         _StreamState(alias, ReplyBudget(alias, request.limits)),
                         SSEDecoder(self.profile.max_line_bytes), request.sent)

    async def context_window(self, model: str) -> WindowInfo | None:
        return None  # no metadata endpoint we rely on; windows come from the settings

    async def count_tokens(self, request: ProviderRequest) -> TokenCount | None:
        if self.profile.count_endpoint == "off" or self._no_count:
            return None
        status, count = await anthropic_count(self._client, self._url("/v1/messages/count_tokens"),
                                              self._headers(), request_body(request))
        self._no_count = status == 404  # an Anthropic-style proxy without it: asked once
        return count
