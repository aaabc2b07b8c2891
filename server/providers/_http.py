"""The HTTP boundary shared by the network dialects: one place where httpx failures and error bodies
become ``server.errors`` classes.

    transport failure (refused, timeout, dropped)   -> Unavailable
    context overflow (any dialect, see below)       -> ContextOverflow
    401 / 403, authentication_error                 -> AuthError
    429, rate_limit_error                           -> RateLimited (retry_after from Retry-After)
    503 / 529, overloaded_error                     -> Overloaded
    other 5xx, api_error, error event after 200     -> Unavailable
    other 4xx                                       -> ProtocolError

``overflow_signal`` is the one context-overflow recogniser for all dialects: OpenAI
``error.code == "context_length_exceeded"``; llama.cpp ``error.type == "exceed_context_size_error"``
(400 or 500, with ``n_prompt_tokens``/``n_ctx``); vLLM's "maximum context length ... you requested M
tokens" (top-level ``{"object": "error"}`` or nested ``error``); Anthropic's "prompt is too long: N
tokens > M maximum"; Ollama's "the input length exceeds the context length" and kin. Every message
names the provider alias and the HTTP status.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import httpx

from server.config import ProviderProfile
from server.errors import (
    AuthError,
    ContextOverflow,
    Overloaded,
    ProtocolError,
    ProviderError,
    RateLimited,
    Unavailable,
)

_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context length|context window|context size|prompt is too long"
    r"|exceeds? the (?:available )?context|too many tokens",
    re.IGNORECASE,
)
_LIMIT = re.compile(r"maximum context length is (\d+)|(\d+) maximum|context length of (\d+)", re.I)
_REQUESTED = re.compile(r"(?:resulted in|requested|too long:) (\d+) tokens", re.I)
_NOT_OVERFLOW_STATUS = (401, 403, 404, 429, 503, 529)


@dataclass(frozen=True)
class Overflow:
    """What a provider said about an overflow; either count is None when it did not say."""

    requested: int | None = None
    limit: int | None = None


def build_client(profile: ProviderProfile) -> httpx.AsyncClient:
    # The read timeout bounds the silence between chunks, not the whole reply.
    timeout = httpx.Timeout(profile.timeout_seconds, connect=min(10.0, profile.timeout_seconds))
    return httpx.AsyncClient(timeout=timeout)


def error_parts(payload: Any) -> tuple[str, str, Any, Mapping[str, Any]]:
    """(message, type, code, the error object) from any dialect's error body."""
    if isinstance(payload, str):
        return payload, "", None, {}
    if not isinstance(payload, Mapping):
        return "", "", None, {}
    inner = payload.get("error", payload)
    if isinstance(inner, str):  # Ollama: {"error": "..."}
        return inner, "", None, payload
    if not isinstance(inner, Mapping):
        return "", "", None, payload
    message = inner.get("message") or payload.get("message") or ""
    return str(message), str(inner.get("type") or ""), inner.get("code"), inner


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_group(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    if match is None:
        return None
    return int(next(group for group in match.groups() if group is not None))


def overflow_signal(status: int | None, payload: Any) -> Overflow | None:
    """The context-overflow recogniser shared by every dialect; None when this is not an overflow."""
    message, kind, code, error = error_parts(payload)
    if kind == "exceed_context_size_error":
        return Overflow(_int(error.get("n_prompt_tokens")), _int(error.get("n_ctx")))
    structural = code == "context_length_exceeded"
    if not structural and (status in _NOT_OVERFLOW_STATUS or not _OVERFLOW_TEXT.search(message)):
        return None
    return Overflow(_first_group(_REQUESTED, message), _first_group(_LIMIT, message))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def translate_error(alias: str, status: int | None, payload: Any,
             headers: Mapping[str, str] | None = None) -> ProviderError:
    """The error for an error body; ``status`` None means an error event after HTTP 200."""
    message, kind, _, _ = error_parts(payload)
    where = f"HTTP {status}" if status is not None else "HTTP 200, then an error event"
    text = f"{alias}: {where}: {message or kind or 'no message'}"
    overflow = overflow_signal(status, payload)
    if overflow is not None:
        return _overflow_error(text, status, overflow)
    if status in (401, 403) or kind in ("authentication_error", "permission_error"):
        return AuthError(text, status=status)
    if status == 429 or kind == "rate_limit_error":
        return RateLimited(text, status=status, retry_after=retry_after(headers or {}))
    if status in (503, 529) or kind == "overloaded_error":
        return Overloaded(text, status=status)
    if status is None or status >= 500 or kind == "api_error":
        return Unavailable(text, status=status)
    return ProtocolError(text, status=status)


def _overflow_error(text: str, status: int | None, overflow: Overflow) -> ContextOverflow:
    return ContextOverflow(text, status=status, requested_tokens=overflow.requested,
                           limit_tokens=overflow.limit)


def parse_body(body: bytes) -> Any:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


def transport_error(alias: str, exc: httpx.HTTPError, *, started: bool) -> ProviderError:
    if isinstance(exc, httpx.TimeoutException):
        return Unavailable(f"{alias}: timed out ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError):
        return Unavailable(f"{alias}: cannot connect to {_url(exc)}: {exc}")
    if started:
        return Unavailable(f"{alias}: HTTP 200, then the stream ended early: {exc}", status=200)
    return Unavailable(f"{alias}: {type(exc).__name__}: {exc}")


def _url(exc: httpx.HTTPError) -> str:
    try:
        return str(exc.request.url.copy_with(query=None))
    except RuntimeError:  # an error raised before any request was attached
        return "the provider"


def stream_ended_early(alias: str) -> Unavailable:
    return Unavailable(f"{alias}: HTTP 200, then the stream ended early (no terminator)", status=200)


@asynccontextmanager
async def open_stream(client: httpx.AsyncClient, alias: str, url: str, body: Mapping[str, Any],
                      headers: Mapping[str, str]) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the 2xx streaming response; every failure leaves as a ProviderError,
    including transport errors raised while the caller reads the body inside the ``with``."""
    started = False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code >= 400:
                raw = await response.aread()
                raise translate_error(alias, response.status_code, parse_body(raw), response.headers)
            started = True
            yield response
    except httpx.HTTPError as exc:
        raise transport_error(alias, exc, started=started) from exc


async def get_json(client: httpx.AsyncClient, method: str, url: str, *,
                   headers: Mapping[str, str], body: Any = None) -> Any:
    """A small metadata call; None on any failure (discovery never raises)."""
    try:
        response = await client.request(method, url, headers=headers, json=body)
        if response.status_code != 200:
            return None
        return response.json()
    except (httpx.HTTPError, ValueError):
        return None


DRAIN_SECONDS = 2.0


class HttpProvider:
    """What the three HTTP dialects share: the client, URLs, and the loop that feeds decoded
    events through a dialect's stream state until it says the reply is complete."""

    kind = "http"

    def __init__(self, profile: ProviderProfile, client: httpx.AsyncClient | None = None) -> None:
        self.profile = profile
        self._owns_client = client is None
        self._client = client or build_client(profile)

    def _url(self, path: str) -> str:
        return self.profile.base_url.rstrip("/") + path

    def _headers(self) -> dict[str, str]:
        key = self.profile.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _run(self, path: str, body: Mapping[str, Any], state: StreamState,
                   decode: Callable[[AsyncIterator[bytes]], AsyncGenerator[Any, None]]
                   ) -> AsyncGenerator[Any, None]:
        alias = self.profile.alias
        async with open_stream(self._client, alias, self._url(path), body, self._headers()) as response:
            async with aclosing(decode(response.aiter_bytes())) as events:
                try:
                    async for event in events:
                        for item in state.handle(event):
                            yield item
                        if state.done:
                            break
                except ValueError as exc:
                    raise ProtocolError(f"{alias}: HTTP 200, then a part that is not JSON: {exc}") from exc
                if state.done:
                    # Read the body to its end so the pooled connection is kept for the next call;
                    # a response left half-read costs a new TCP connection every turn.
                    with anyio.move_on_after(DRAIN_SECONDS):
                        async for _ in events:
                            pass
                    return
        raise stream_ended_early(alias)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


class StreamState(Protocol):
    done: bool

    def handle(self, event: Any) -> list[Any]: ...


def tool_arguments(alias: str, name: str, parts: list[str]) -> dict[str, Any]:
    """A streamed tool call's arguments, joined from their fragments; must be a JSON object."""
    text = "".join(parts).strip() or "{}"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"{alias}: HTTP 200, then tool call {name!r} with arguments that are not "
                            f"JSON: {text[:200]!r}") from exc
    if not isinstance(value, dict):
        raise ProtocolError(f"{alias}: tool call {name!r} arguments are not an object")
    return value
