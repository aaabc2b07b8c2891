"""Error translation for the network dialects: the one place where httpx failures and error bodies
become ``server.errors`` classes (``_http`` calls it at the boundary; dialects for error events).

    transport failure (refused, timeout, dropped)   -> Unavailable
    no free connection in the pool in time          -> Overloaded (our limit, not the provider's)
    a stream with no content for idle_timeout       -> Unavailable
    a line over max_line_bytes, a part not JSON     -> ProtocolError
    context overflow (any dialect, see below)       -> ContextOverflow
    401 / 403, authentication_error                 -> AuthError
    429, rate_limit_error                           -> RateLimited (retry_after from Retry-After)
    503 / 529, overloaded_error                     -> Overloaded
    other 5xx, api_error, error event after 200     -> Unavailable
    other 4xx                                       -> ProtocolError

``overflow_signal`` is the one context-overflow recogniser for all dialects: OpenAI
``error.code == "context_length_exceeded"``; llama.cpp ``error.type == "exceed_context_size_error"``
(400 or 500; its ``n_prompt_tokens``/``n_ctx`` fields read first, "request (N tokens) exceeds the
available context size (M tokens)" only when a field is missing); vLLM's "maximum context length
... you requested M tokens" (top-level ``{"object": "error"}`` or nested ``error``), its "'max_tokens'
is too large ... your request has N input tokens" and "context length is only N tokens"; Anthropic's
"prompt is too long: N tokens > M maximum"; Ollama's "the input length exceeds the context length"
and kin. Every message names the provider alias and the HTTP status; ``_http`` shortens and redacts
it (``redact.py``) before it leaves the provider layer.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from server.errors import (
    AuthError,
    ContextOverflow,
    Overloaded,
    ProtocolError,
    ProviderError,
    RateLimited,
    Unavailable,
)
from server.providers.redact import clip

_OVERFLOW_TEXT = re.compile(
    r"maximum context length|context length|context window|context size|prompt is too long"
    r"|exceeds? the (?:available )?context|too many tokens",
    re.IGNORECASE,
)
# (?<!\d): a number is read from its first digit; tried at every digit of a long run, "(\d+) maximum"
# was quadratic.
_LIMIT = re.compile(r"context length is (?:only )?(\d+)|(?<!\d)(\d+) maximum|context length of (\d+)"
                    r"|context size \((\d+) tokens\)", re.I)
_REQUESTED = re.compile(r"(?:resulted in|requested|too long:) (\d+) tokens|request \((\d+) tokens\)"
                        r"|request has (\d+) input tokens", re.I)
_NOT_OVERFLOW_STATUS = (401, 403, 404, 429, 503, 529)
CUT_BODY_CHARS = 200  # of a body too long to read whole: a proxy's page, a dump
KIND_CHARS = 200  # an error type is a short identifier; anything longer is shown cut


@dataclass(frozen=True)
class Overflow:
    """What a provider said about an overflow; either count is None when it did not say."""

    requested: int | None = None
    limit: int | None = None


def error_parts(payload: Any) -> tuple[str, str, Any, Mapping[str, Any]]:
    """(message, type, code, the error object) from any dialect's error body; the message and type are
    clipped (``redact.clip``), so no pattern ever runs over more than ``TEXT_CHARS`` of them."""
    message, kind, code, error = _parts(payload)
    return clip(message), clip(kind, KIND_CHARS), code, error


def _parts(payload: Any) -> tuple[str, str, Any, Mapping[str, Any]]:
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
    if kind == "exceed_context_size_error":  # llama.cpp: its fields first, its wording (which
        # changes between builds) only for a field a build left out
        return Overflow(_int(error.get("n_prompt_tokens")) or _first_group(_REQUESTED, message),
                        _int(error.get("n_ctx")) or _first_group(_LIMIT, message))
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


def parse_body(body: bytes, whole: bool = True) -> Any:
    """An error body as JSON, else as text. Of a body cut at its head (``whole`` False) that is not
    JSON by itself, the text is kept to its first ``CUT_BODY_CHARS`` and says where it was cut."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    if whole:
        return text
    return f"{clip(text, CUT_BODY_CHARS)} [cut after {len(body) // 1024} KiB]".lstrip()


def transport_error(alias: str, exc: httpx.HTTPError, *, started: bool) -> ProviderError:
    if isinstance(exc, httpx.PoolTimeout):
        return Overloaded(f"{alias}: every connection to the provider is busy (max_connections reached)")
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


def idle_too_long(alias: str, seconds: float) -> Unavailable:
    return Unavailable(f"{alias}: HTTP 200, then no content for {seconds:g} s (only keep-alives)",
                       status=200)
