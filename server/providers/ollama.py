"""Ollama's native chat API, streamed as NDJSON.

Wire format: ``POST {base_url}/api/chat`` (base_url like ``http://127.0.0.1:11434``) with
``options.num_ctx`` when the profile sets one (Ollama's ``/v1`` endpoint ignores it, which is why
this dialect exists). Each line is ``{model, message{content, thinking?, tool_calls?}, done}``; the
last has ``done: true``, ``done_reason``, ``prompt_eval_count`` and ``eval_count``. Tool results go
out as role ``tool`` with ``tool_name``; images as ``images: [base64]`` on their message.

Events out: content -> TextDelta, thinking -> ThinkingDelta, each whole tool call -> ToolCallEvent
(Ollama gives no ids, so one is derived from the line and the call: the same reply always yields the
same id, different replies different ids), then Usage (only when ``prompt_eval_count`` is present:
Ollama omits it when the whole prompt came from its cache) and Finish. A ``{"error": ...}`` line
raises; a stream without a ``done: true`` line raises Unavailable.

Window discovery: ``POST /api/show``. ``model_info["<arch>.context_length"]`` is the trained maximum,
not what the server runs with. The effective window is ``profile.num_ctx`` when set (we send it),
else a ``num_ctx`` from the Modelfile ``parameters``, else the trained maximum capped at 4096 (the
server default of recent Ollama releases): an under-estimate only trims early, while an
over-estimate lets Ollama cut the prompt silently. Both figures go in ``detail``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
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
    ToolCallEvent,
    Usage,
    WindowInfo,
)
from server.providers.budget import ReplyBudget
from server.providers.decoders import NDJSONDecoder
from server.providers.openai import wire_tools
from server.providers.translate import translate_error

ASSUMED_SERVER_NUM_CTX = 4096
# [ \t], not \s: a \s* at each line start ran over every newline after it (quadratic).
_NUM_CTX = re.compile(r"^[ \t]*num_ctx[ \t]+(\d+)[ \t]*\r?$", re.MULTILINE)


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "tool" and message.name:
        wire["tool_name"] = message.name
    if message.images:
        wire["images"] = [image.data for image in message.images]
    if message.tool_calls:
        wire["tool_calls"] = [{"function": {"name": call.name, "arguments": call.arguments}}
                              for call in message.tool_calls]
    return wire


def wire_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    return [_wire_message(message) for message in messages if message.left_out is None]


def request_body(request: ProviderRequest, num_ctx: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model, "messages": wire_messages(request.messages),
                            "stream": True}
    options: dict[str, Any] = {}
    if num_ctx > 0:
        options["num_ctx"] = num_ctx
    if request.max_output_tokens:
        options["num_predict"] = request.max_output_tokens
    if options:
        body["options"] = options
    if request.tools:
        body["tools"] = wire_tools(request.tools)
    return body


@dataclass
class _StreamState:
    alias: str
    budget: ReplyBudget
    calls: int = 0
    done: bool = False

    def handle(self, line: Any) -> list[StreamEvent]:
        if not isinstance(line, dict):
            raise ProtocolError(f"{self.alias}: HTTP 200, then a line that is not an object")
        if "error" in line:
            raise translate_error(self.alias, None, line)
        message = line.get("message") or {}
        out: list[StreamEvent] = []
        if message.get("thinking"):
            out.append(ThinkingDelta(message["thinking"]))
        if message.get("content"):
            out.append(TextDelta(message["content"]))
        for call in message.get("tool_calls") or ():
            out.append(self._tool_call(call, line))
        if line.get("done"):
            self.done = True
            out += self._finish(line)
        return out

    def _tool_call(self, call: Any, line: dict[str, Any]) -> ToolCallEvent:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            raise ProtocolError(f"{self.alias}: HTTP 200, then a tool call without a function name")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):  # some models put a JSON string here
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as exc:
                raise ProtocolError(f"{self.alias}: tool call {function['name']!r} arguments "
                                    f"are not JSON") from exc
        if not isinstance(arguments, dict):
            raise ProtocolError(f"{self.alias}: tool call {function['name']!r} arguments are not an object")
        self.calls += 1
        # A call comes whole on its line (bounded by max_line_bytes); an endless run of them is not.
        size = len(json.dumps(arguments, ensure_ascii=False))
        self.budget.call(function["name"])
        self.budget.arguments(function["name"], size, size)
        return ToolCallEvent(call.get("id") or self._call_id(line, function, arguments),
                             function["name"], arguments)

    def _call_id(self, line: dict[str, Any], function: dict[str, Any], arguments: dict[str, Any]) -> str:
        # created_at differs between replies, so equal calls in two turns still get distinct ids.
        seed = json.dumps([line.get("created_at"), self.calls, function["name"], arguments], sort_keys=True)
        return "call_" + hashlib.sha1(seed.encode("utf-8")).hexdigest()[:16]

    def _finish(self, line: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        prompt = line.get("prompt_eval_count")
        if isinstance(prompt, int):
            out.append(Usage(prompt, int(line.get("eval_count") or 0)))
        reason = line.get("done_reason") or "stop"
        if reason == "stop" and self.calls:
            reason = "tool_calls"  # Ollama says "stop" even when the reply is tool calls
        out.append(Finish(reason, line.get("model")))
        return out


class OllamaProvider(_http.HttpProvider):
    kind = "ollama"  # the key, if any, is for an Ollama behind an authenticating proxy

    def stream(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        body = request_body(request, self.profile.num_ctx)
        alias = self.profile.alias
        return self._run("/api/chat", body, _StreamState(alias, ReplyBudget(alias, request.limits)),
                         NDJSONDecoder(self.profile.max_line_bytes), request.sent)

    async def context_window(self, model: str) -> WindowInfo | None:
        show = await _http.get_json(self._client, "POST", self._url("/api/show"),
                                    headers=self._headers(), body={"model": model})
        if not isinstance(show, dict):
            return None
        trained = _trained_window(show.get("model_info"))
        configured = _modelfile_num_ctx(show.get("parameters"))
        detail = {"trained": trained, "modelfile_num_ctx": configured, "num_ctx": self.profile.num_ctx}
        if self.profile.num_ctx > 0:
            return WindowInfo(self.profile.num_ctx, "provider", {**detail, "basis": "profile num_ctx"})
        if configured:
            return WindowInfo(configured, "provider", {**detail, "basis": "modelfile num_ctx"})
        if trained:
            window = min(trained, ASSUMED_SERVER_NUM_CTX)
            return WindowInfo(window, "provider", {**detail, "basis": "assumed server default"})
        return None


def _trained_window(info: Any) -> int | None:
    if not isinstance(info, dict):
        return None
    arch = info.get("general.architecture")
    value = info.get(f"{arch}.context_length") if arch else None
    if not isinstance(value, int):  # no architecture key: take any *.context_length
        value = next((v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)),
                     None)
    return value if isinstance(value, int) and value > 0 else None


def _modelfile_num_ctx(parameters: Any) -> int | None:
    match = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    return int(match.group(1)) if match else None
