"""Count endpoints: a provider's own count of a whole request, asked between turns (never per tool:
counting tool by tool adds the shared tool preamble to each).

Wire formats, as each project documents and serves them:

    vLLM       POST {root}/tokenize {model, messages, tools, add_generation_prompt: true}
               -> {count, max_model_len, tokens}: the count and the window in one call
    llama.cpp  POST {root}/apply-template {messages, tools} -> {prompt}, then
               POST {root}/tokenize {content: prompt} -> {tokens: [...]}; GET {root}/props ->
               {default_generation_settings: {n_ctx}} for the window. (llama.cpp's /tokenize given
               ``messages`` answers {tokens: []}: that is how it is told from vLLM's.)
    OpenAI     POST {base_url}/responses/input_tokens {model, input, tools}
               -> {object: "response.input_tokens", input_tokens}
    Anthropic  POST {base_url}/v1/messages/count_tokens {model, messages, system, tools}
               -> {input_tokens}

``{root}`` is the OpenAI-style base_url without its ``/v1``. An OpenAI-compatible profile probes in
that order once; the first that answers is kept, and when every one answers 404 the provider has
none (remembered: ``count_endpoint = "auto"`` tries once). Any other failure (a timeout, a 5xx) is
no count this time. Every call has ``_http.fetch_json``'s bounds (8 MiB, ``COUNT_SECONDS``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from server.history.messages import ChatMessage
from server.providers import _http
from server.providers.base import ProviderRequest, TokenCount, ToolSpec

COUNT_SECONDS = 5.0
NONE = "none"  # the probe found no endpoint


def _count(value: Any, key: str) -> int | None:
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None


class OpenAICompatibleCounter:
    """Finds and calls the count endpoint an OpenAI-style server has (vLLM, llama.cpp or OpenAI)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str]) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._root = self._base.removesuffix("/v1")
        self._headers = dict(headers)
        self.way: str | None = None  # vllm | llamacpp | responses | none, once found

    async def count(self, request: ProviderRequest, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]]) -> TokenCount | None:
        if self.way == NONE:
            return None
        if self.way in (None, "vllm", "llamacpp"):
            status, found = await self._tokenize(request, messages, tools)
            if found is not None or self.way is not None:
                return found
            if status != 404:
                return None  # no answer this time (a timeout, a 5xx): probed again next time
        return await self._responses(request)

    async def _post(self, url: str, body: Any) -> tuple[int | None, Any]:
        return await _http.fetch_json(self._client, "POST", url, headers=self._headers, body=body,
                                      seconds=COUNT_SECONDS)

    async def _tokenize(self, request: ProviderRequest, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]]) -> tuple[int | None, TokenCount | None]:
        body: dict[str, Any] = {"model": request.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        if self.way != "llamacpp":
            status, answer = await self._post(self._root + "/tokenize", body)
            count = _count(answer, "count")
            if count is not None:
                self.way = "vllm"
                return status, TokenCount(count, "vllm /tokenize", _count(answer, "max_model_len") or None)
            if status != 200 or not isinstance(answer, dict) or "tokens" not in answer:
                return status, None
        return 200, await self._llamacpp(messages, tools)

    async def _llamacpp(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
                        ) -> TokenCount | None:
        template: dict[str, Any] = {"messages": messages}
        if tools:
            template["tools"] = tools
        _, applied = await self._post(self._root + "/apply-template", template)
        prompt = applied.get("prompt") if isinstance(applied, dict) else None
        if not isinstance(prompt, str):
            return None
        _, tokenized = await self._post(self._root + "/tokenize", {"content": prompt})
        tokens = tokenized.get("tokens") if isinstance(tokenized, dict) else None
        if not isinstance(tokens, list):
            return None
        self.way = "llamacpp"
        _, props = await _http.fetch_json(self._client, "GET", self._root + "/props",
                                          headers=self._headers, seconds=COUNT_SECONDS)
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        return TokenCount(len(tokens), "llama.cpp /apply-template + /tokenize", _count(settings, "n_ctx"))

    async def _responses(self, request: ProviderRequest) -> TokenCount | None:
        body: dict[str, Any] = {"model": request.model, "input": responses_input(request.messages)}
        if request.tools:
            body["tools"] = responses_tools(request.tools)
        status, answer = await self._post(self._base + "/responses/input_tokens", body)
        count = _count(answer, "input_tokens")
        if count is not None:
            self.way = "responses"
            return TokenCount(count, "openai /v1/responses/input_tokens")
        if status == 404 and self.way is None:
            self.way = NONE  # neither /tokenize nor /responses/input_tokens: remembered
        return None


def responses_input(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """ChatMessages as Responses API input items (messages, function calls, their outputs)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.left_out is not None:
            continue
        if message.role == "tool":
            items.append({"type": "function_call_output", "call_id": message.tool_call_id or "",
                          "output": message.content})
            continue
        if message.content or not message.tool_calls:
            items.append({"role": message.role, "content": _responses_content(message)})
        for call in message.tool_calls or ():
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": json.dumps(call.arguments, ensure_ascii=False)})
    return items


def _responses_content(message: ChatMessage) -> str | list[dict[str, Any]]:
    if not message.images:
        return message.content
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": message.content}] if message.content else []
    return parts + [{"type": "input_image", "image_url": f"data:{image.media_type};base64,{image.data}"}
                    for image in message.images]


def responses_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": "function", "name": tool.name, "description": tool.description,
             "parameters": tool.parameters} for tool in tools]


async def anthropic_count(client: httpx.AsyncClient, url: str, headers: Mapping[str, str],
                          body: dict[str, Any]) -> tuple[int | None, TokenCount | None]:
    """(status, count) of Anthropic's count_tokens for a Messages body (its max_tokens and stream
    taken off: the endpoint takes the prompt's fields only)."""
    prompt = {key: value for key, value in body.items() if key not in ("max_tokens", "stream")}
    status, answer = await _http.fetch_json(client, "POST", url, headers=headers, body=prompt,
                                            seconds=COUNT_SECONDS)
    count = _count(answer, "input_tokens")
    return status, None if count is None else TokenCount(count, "anthropic /v1/messages/count_tokens")
