"""OpenAI-compatible chat completions, streamed as Server-Sent Events.

Wire format: ``POST {base_url}/chat/completions`` (base_url ends in ``/v1``) with ``stream: true`` and
``stream_options.include_usage``; the reply is ``data: <chat.completion.chunk JSON>`` events ending
in ``data: [DONE]``. Spoken by OpenAI, vLLM, llama.cpp, OpenRouter, LM Studio and Ollama's ``/v1``.

Events out: ``delta.content`` -> TextDelta; ``delta.reasoning_content`` / ``delta.reasoning`` ->
ThinkingDelta; ``delta.tool_calls`` fragments are joined per ``index`` and yielded as ToolCallEvents
when the choice finishes; the usage chunk (``choices`` empty or null) -> Usage; then Finish, always
last. A stream that closes before ``[DONE]`` raises Unavailable after the text already yielded.

Counts (``count_endpoint``): vLLM's or llama.cpp's ``/tokenize``, else OpenAI's
``/v1/responses/input_tokens`` (``counts.py``).

Window discovery: ``GET {base_url}/models``; vLLM cards carry ``max_model_len``, OpenRouter cards
``context_length`` or ``top_provider.context_length``; plain OpenAI cards carry nothing (None).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from server.config.settings import ProviderProfile
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
    ToolSpec,
    Usage,
    WindowInfo,
)
from server.providers.budget import ReplyBudget
from server.providers.counts import NONE, OpenAICompatibleCounter
from server.providers.decoders import SSEDecoder, SSEEvent, parse_json
from server.providers.translate import translate_error

_WINDOW_FIELDS = ("max_model_len", "context_length")


def _image_part(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}


def _user_content(message: ChatMessage) -> str | list[dict[str, Any]]:
    if not message.images:
        return message.content
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    return parts + [_image_part(image.media_type, image.data) for image in message.images]


def _assistant(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
            for call in message.tool_calls
        ]
    return wire


def wire_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """ChatMessages as OpenAI messages. Tool messages take text only, so images a tool returned
    follow the run of tool messages as one user message."""
    wire: list[dict[str, Any]] = []
    tool_images: list[dict[str, Any]] = []
    for message in messages:
        if message.left_out is not None:
            continue
        if message.role != "tool" and tool_images:
            wire.append({"role": "user", "content": tool_images})
            tool_images = []
        if message.role == "tool":
            wire.append({"role": "tool", "tool_call_id": message.tool_call_id or "",
                         "content": message.content})
            tool_images += [_image_part(i.media_type, i.data) for i in message.images or ()]
        elif message.role == "assistant":
            wire.append(_assistant(message))
        elif message.role == "user":
            wire.append({"role": "user", "content": _user_content(message)})
        else:
            wire.append({"role": message.role, "content": message.content})
    if tool_images:
        wire.append({"role": "user", "content": tool_images})
    return wire


def wire_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                              "parameters": tool.parameters}} for tool in tools]


def request_body(request: ProviderRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": wire_messages(request.messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = wire_tools(request.tools)
    if request.max_output_tokens:
        body["max_tokens"] = request.max_output_tokens
    return body


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0  # characters of arguments so far


@dataclass
class _StreamState:
    """Everything one reply accumulates between chunks."""

    alias: str
    budget: ReplyBudget
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    usage: Usage | None = None
    reason: str | None = None
    model: str | None = None
    done: bool = False

    def handle(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data
        if data[:1] != "{" and data.strip() == "[DONE]":  # a chunk (an object) is never stripped
            self.done = True
            return self._finish()
        try:
            chunk = parse_json(data)
        except ValueError as exc:
            raise ProtocolError(f"{self.alias}: HTTP 200, then a chunk that is not JSON: "
                                f"{event.data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise ProtocolError(f"{self.alias}: HTTP 200, then a chunk that is not an object")
        if event.event == "error" or "error" in chunk:
            raise translate_error(self.alias, None, chunk)
        return self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        # Once per streamed piece: the events go into one list, nothing is made for what is absent.
        self.model = chunk.get("model") or self.model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        out: list[StreamEvent] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta:
                self._delta(delta, out)
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]
                out += self._tool_calls()
        return out

    def _usage(self, usage: dict[str, Any]) -> None:
        details = usage.get("completion_tokens_details")
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        self.usage = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                           reasoning if isinstance(reasoning, int) else None)

    def _delta(self, delta: dict[str, Any], out: list[StreamEvent]) -> None:
        thinking = delta.get("reasoning_content") or delta.get("reasoning")
        if thinking and isinstance(thinking, str):
            out.append(ThinkingDelta(thinking))
        content = delta.get("content")
        if content and type(content) is str:  # json makes str itself, never a subclass
            out.append(TextDelta(content))
        calls = delta.get("tool_calls")
        if calls:
            for fragment in calls:
                self._fragment(fragment)

    def _fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index", len(self.calls))
        function = fragment.get("function") or {}
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _PartialCall()
            self.budget.call(str(function.get("name") or ""), str(fragment.get("id") or ""))
        call.id = fragment.get("id") or call.id
        call.name = function.get("name") or call.name
        piece = function.get("arguments")
        if piece:
            call.size += len(piece)
            self.budget.arguments(call.name, call.size, len(piece))
            call.arguments.append(piece)

    def _tool_calls(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for index in sorted(self.calls):
            call = self.calls[index]
            arguments = _http.tool_arguments(self.alias, call.name, call.arguments)
            out.append(ToolCallEvent(call.id or f"call_{index}", call.name, arguments))
        self.calls.clear()
        return out

    def _finish(self) -> list[StreamEvent]:
        out = self._tool_calls()  # servers that stream calls but never send finish_reason
        if self.usage is not None:
            out.append(self.usage)
        out.append(Finish(self.reason or "stop", self.model))
        return out


class OpenAIProvider(_http.HttpProvider):
    kind = "openai"

    def __init__(self, profile: ProviderProfile, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(profile, client)
        self._counter = OpenAICompatibleCounter(self._client, profile.base_url, self._headers())

    async def count_tokens(self, request: ProviderRequest) -> TokenCount | None:
        if self.profile.count_endpoint == "off" or self._counter.way == NONE:
            return None  # before the request is translated: a session asks after every turn
        tools = wire_tools(request.tools) if request.tools else []
        return await self._counter.count(request, wire_messages(request.messages), tools)

    def stream(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        alias = self.profile.alias
        return self._run("/chat/completions", request_body(request),
                         _StreamState(alias, ReplyBudget(alias, request.limits)),
                         SSEDecoder(self.profile.max_line_bytes), request.sent)

    async def context_window(self, model: str) -> WindowInfo | None:
        listing = await _http.get_json(self._client, "GET", self._url("/models"), headers=self._headers())
        cards = listing.get("data") if isinstance(listing, dict) else None
        for card in cards if isinstance(cards, list) else ():
            if isinstance(card, dict) and card.get("id") == model:
                return _card_window(card)
        return None



def _card_window(card: dict[str, Any]) -> WindowInfo | None:
    for name in _WINDOW_FIELDS:
        value = card.get(name)
        if isinstance(value, int) and value > 0:
            return WindowInfo(value, "provider", {"field": name})
    top = card.get("top_provider")
    value = top.get("context_length") if isinstance(top, dict) else None
    if isinstance(value, int) and value > 0:
        return WindowInfo(value, "provider", {"field": "top_provider.context_length"})
    return None
