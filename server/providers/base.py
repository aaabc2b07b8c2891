"""The one interface every provider dialect implements.

A provider turns a ``ProviderRequest`` into an async stream of ``StreamEvent``s and translates every
failure of its dialect into ``server.errors.ProviderError`` subclasses at its boundary, so the turn
loop never sees httpx exceptions or dialect error bodies. ``context_window`` asks the provider's
metadata for a model's capacity (None when the dialect cannot say).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.history.messages import ChatMessage


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object


MAX_REPLY_CHARS = 4 * 1024 * 1024  # [runtime] max_reply_chars' default: no real reply comes near it
MAX_TOOL_ARGUMENT_CHARS = 1024 * 1024


@dataclass(frozen=True)
class ReplyLimits:
    """What one call's reply may hold: ``chars`` of text, thinking and tool-call arguments together,
    ``tool_argument_chars`` of one call's arguments. Past either the dialect raises ReplyTooLarge."""

    chars: int = MAX_REPLY_CHARS
    tool_argument_chars: int = MAX_TOOL_ARGUMENT_CHARS


@dataclass(frozen=True)
class ProviderRequest:
    model: str
    messages: Sequence[ChatMessage]
    tools: Sequence[ToolSpec] = ()
    max_output_tokens: int | None = None
    limits: ReplyLimits = ReplyLimits()
    # Called once the request has left for the provider (HTTP dialects: its last byte is written),
    # before its answer is read: what the caller does then overlaps the provider's wait.
    sent: Callable[[], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call (dialects that stream fragments join them before yielding this)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Tokens as the provider reports them; input counts everything the prompt occupied."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int | None = None  # of output_tokens, spent on reasoning (None: not said)


@dataclass(frozen=True)
class Finish:
    reason: str  # stop | length | tool_calls | ... as the dialect says, normalised where obvious
    model: str | None = None  # the model the provider says served the call, when it says


StreamEvent = TextDelta | ThinkingDelta | ToolCallEvent | Usage | Finish


@dataclass(frozen=True)
class WindowInfo:
    tokens: int
    source: str = "provider"
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenCount:
    """A provider's own count of a whole request (``endpoint`` names the call that gave it), and the
    window when the same answer names it (vLLM's ``max_model_len``, llama.cpp's ``n_ctx``)."""

    tokens: int
    endpoint: str
    window: int | None = None


class Provider(Protocol):
    kind: str

    def stream(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]: ...

    async def context_window(self, model: str) -> WindowInfo | None: ...

    async def count_tokens(self, request: ProviderRequest) -> TokenCount | None:
        """The provider's count of ``request`` from its count endpoint; None when it has none, or
        when the profile's ``count_endpoint`` is off. Never raises."""
        ...

    async def aclose(self) -> None: ...
