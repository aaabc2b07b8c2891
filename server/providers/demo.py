"""The embedded offline ``demo`` provider: no key, no network, useful the moment the server starts.

Dialect: in-process; it consumes a ``ProviderRequest`` and yields the same stream events as the
network dialects. Models: ``demo-small`` (a 4,096-token window, so trims show within a few turns) and
``demo-open`` (its 16,384-token window is not published, so its capacity is unknown to meterchat).
It counts tokens with its own rule (ceil(UTF-8 bytes / 4.4) + 3 per message), reports usage like a
real provider, and answers a prompt over its window with a context-overflow error.
Behaviour: ``echo <text>`` replies with exactly <text>; asking to look up / find / read a document
calls the ``lookup_document`` tool when it is offered; a message that names another offered tool
(an MCP server's) calls that one (``demo_tools``); after a tool result it summarises the document or
quotes the result; otherwise it explains what it sees of the conversation and its context.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import anyio

from server.config.settings import ProviderProfile
from server.errors import ContextOverflow, ProtocolError
from server.history.messages import ChatMessage, is_turn_start
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
from server.providers.demo_tools import OWN_TOOL, arguments, pick_tool, quote_result
from server.tools.demo import known_titles

DEMO_WINDOWS = {"demo-small": 4096, "demo-open": 16384}
_LOOKUP = re.compile(r"\b(look\s*up|lookup|find|fetch|read)\b", re.IGNORECASE)


def demo_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(-(-len(m.content.encode("utf-8")) * 10 // 44) + 3 for m in messages)


def _schema_tokens(request: ProviderRequest) -> int:
    """Tool schemas occupy the prompt too, as they do with real providers."""
    size = sum(len(json.dumps([t.name, t.description, t.parameters])) for t in request.tools)
    return -(-size * 10 // 44)


def _pieces(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


def _guess_title(text: str) -> str:
    lowered = text.lower()
    for title in known_titles():
        if title in lowered:
            return title
    match = _LOOKUP.search(text)
    rest = text[match.end():] if match else text
    rest = re.sub(r"^\s*(the|a|an|document|novel|book|called|titled)\s+", "", rest.strip(), flags=re.I)
    return rest.strip(" .?!\"'") or known_titles()[0]


class DemoProvider:
    kind = "demo"

    def __init__(self, profile: ProviderProfile) -> None:
        self.profile = profile
        self._calls = 0

    async def context_window(self, model: str) -> WindowInfo | None:
        return None  # the demo publishes no metadata: capacity comes from configuration only

    async def count_tokens(self, request: ProviderRequest) -> TokenCount | None:
        return None  # nothing to ask: the demo's count is its own estimate

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        if request.model not in DEMO_WINDOWS:
            raise ProtocolError(f"demo: unknown model {request.model!r}; "
                                f"try {', '.join(DEMO_WINDOWS)}", status=404)
        prompt = demo_tokens(request.messages) + _schema_tokens(request)
        window = DEMO_WINDOWS[request.model]
        if prompt > window:
            raise ContextOverflow(f"demo: prompt is too long: {prompt} tokens > {window} maximum",
                                  status=400, requested_tokens=prompt, limit_tokens=window)
        self._calls += 1
        if request.sent is not None:  # taken: the reply is on its way
            request.sent()
        async for event in self._reply(request, prompt):
            yield event

    async def _reply(self, request: ProviderRequest, prompt: int) -> AsyncGenerator[StreamEvent, None]:
        messages = list(request.messages)
        last = messages[-1] if messages else ChatMessage("user", "")
        text = last.content
        if last.role == "user" and text.startswith("echo "):
            reply = text[5:]
        elif last.role == "user" and any(t.name == OWN_TOOL for t in request.tools) and _LOOKUP.search(text):
            async for event in self._call_tool(request, text, prompt):
                yield event
            return
        elif last.role == "user" and (tool := pick_tool(text, request.tools)) is not None:
            async for event in self._call(tool.name, arguments(tool, text), prompt, request.model):
                yield event
            return
        elif last.role == "tool":
            reply = _summarise_document(last) if last.name in (OWN_TOOL, None) else quote_result(last)
        else:
            yield ThinkingDelta(f"Counting {len(messages)} messages against my window.")
            reply = _describe(request.model, messages, prompt)
        for piece in _pieces(reply):
            await self._pause()
            yield TextDelta(piece)
        yield Usage(prompt, demo_tokens([ChatMessage("assistant", reply)]))
        yield Finish("stop", model=request.model)

    async def _call_tool(self, request: ProviderRequest, text: str, prompt: int
                         ) -> AsyncGenerator[StreamEvent, None]:
        title = _guess_title(text)
        yield ThinkingDelta(f"The user wants a document; calling lookup_document for {title!r}.")
        async for event in self._call(OWN_TOOL, {"title": title}, prompt, request.model):
            yield event

    async def _call(self, name: str, args: dict[str, Any], prompt: int, model: str
                    ) -> AsyncGenerator[StreamEvent, None]:
        await self._pause()
        yield ToolCallEvent(f"demo_call_{self._calls}", name, args)
        yield Usage(prompt, 12)
        yield Finish("tool_calls", model=model)

    async def _pause(self) -> None:
        # Even with no delay, yield between pieces as a network stream does: a whole reply in one
        # step of the event loop would hold up every other session meanwhile.
        await anyio.sleep(self.profile.delay_ms / 1000 if self.profile.delay_ms > 0 else 0)


def _summarise_document(result: ChatMessage) -> str:
    body = result.content
    first = body.split("\n\n", 2)
    heading = first[0].lstrip("# ").strip() if first else "the document"
    opening = first[1].split(". ")[0] + "." if len(first) > 1 else body[:200]
    return (f"I looked up **{heading}**: {len(body):,} characters, about {len(body) // 4:,} tokens of "
            f"context for every later call.\n\n> {opening}\n\nAsk for another title and watch the meter; "
            f"on `demo-small` the older turns are trimmed once the budget is reached.")


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _describe(model: str, messages: list[ChatMessage], prompt: int) -> str:
    turns = sum(1 for m in messages if is_turn_start(m))
    tools = sum(1 for m in messages if m.role == "tool")
    replies = sum(1 for m in messages if m.role == "assistant")
    window = (f"my window is {DEMO_WINDOWS[model]:,} tokens" if model == "demo-small"
              else "my window is not published, so meterchat shows it as unknown")
    omitted = any(m.breadcrumb for m in messages)
    lines = [
        f"I am **{model}**, meterchat's offline demo model. In my context I see "
        f"{_count(len(messages), 'message')}: {_count(turns, 'user turn')}, "
        f"{_count(replies, 'earlier reply', 'earlier replies')} and {_count(tools, 'tool result')}, "
        f"{prompt:,} tokens by my own count; {window}.",
    ]
    if omitted:
        lines.append("A note tells me that earlier turns were omitted to fit the context window.")
    lines += [
        "",
        "Things to try:",
        "- `look up the paper moon` calls a document tool that returns a long text;",
        "- `/model demo/demo-open` switches this session to a model whose window is unknown;",
        "- `echo **any markdown**` makes me repeat your text exactly.",
        "",
        "```python\nbudget = min(max_context_tokens, context_window)  # the meter's marker\n```",
    ]
    return "\n".join(lines)
