"""The HTTP boundary shared by the network dialects: the client and its limits, the streaming call, and
the loop that feeds a reply's bytes through a dialect's decoder and stream state.

Every resource a provider could exhaust is bounded here: connections (``max_connections``; a call that
finds none free within ``pool_timeout_seconds`` is ``Overloaded`` at once instead of queueing behind
the others), error bodies (their first ``MAX_ERROR_BODY`` bytes, whatever came within
``ERROR_BODY_SECONDS``; the rest is never read and the connection is dropped), metadata answers
(``get_json``: ``MAX_METADATA_BODY`` bytes within ``METADATA_SECONDS``, else no answer), lines
(``max_line_bytes``, else ``ProtocolError``), the reply itself (``ReplyBudget``: text, thinking and
tool-call arguments, else ``ReplyTooLarge``, the response closed unread) and silence dressed as
keep-alives (no event for ``idle_timeout_seconds``: ``Unavailable``). What leaves is safe: error
messages are shortened and redacted (the full body goes to the DEBUG log, redacted too), text is
valid Unicode (``redact.py``).
Failures are translated in ``translate.py``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import httpx

from server.config.settings import ProviderProfile
from server.errors import ProtocolError, ProviderError
from server.providers.base import ProviderRequest, StreamEvent, TextDelta, TokenCount
from server.providers.budget import ReplyBudget
from server.providers.decoders import LineTooLong
from server.providers.h1 import BODY, REQUEST_SENT, H1Body
from server.providers.redact import redact, short_message
from server.providers.text import TextGuard
from server.providers.translate import (
    idle_too_long,
    parse_body,
    stream_ended_early,
    translate_error,
    transport_error,
)
from server.providers.transport import build_transport

log = logging.getLogger("server.providers")

MAX_ERROR_BODY = 64 * 1024
ERROR_BODY_SECONDS = 1.0  # an error body dripping slower than this is judged on what came by then
MAX_METADATA_BODY = 8 * 1024 * 1024  # /v1/models of a large router is a few MB; parsing 8 MB is ms
METADATA_SECONDS = 10.0  # a discovery call holds the first turn on its route: bound it whole
DRAIN_SECONDS = 2.0


def build_client(profile: ProviderProfile) -> httpx.AsyncClient:
    # The read timeout bounds the silence between chunks, not the whole reply; silence longer than
    # the idle limit is no content either.
    read = min(profile.timeout_seconds, profile.idle_timeout_seconds)
    timeout = httpx.Timeout(read, connect=min(10.0, read), pool=profile.pool_timeout_seconds)
    # Every connection may stay alive: above the keep-alive count each turn would pay a new TCP (and
    # TLS) handshake.
    limits = httpx.Limits(max_connections=profile.max_connections,
                          max_keepalive_connections=profile.max_connections,
                          keepalive_expiry=profile.keepalive_expiry_seconds)
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=build_transport(limits))


def secrets_of(profile: ProviderProfile) -> tuple[str, ...]:
    """What must never appear in a message: the key, and the credentials in ``base_url``."""
    parts = urlsplit(profile.base_url)
    found = [profile.api_key, parts.password or ""]
    if parts.username and parts.password:
        found.append(f"{parts.username}:{parts.password}")
    return tuple(secret for secret in found if secret)


async def read_head(response: httpx.Response, limit: int, seconds: float) -> tuple[bytes, bool]:
    """(at most ``limit`` bytes of a body, whether that was all of it), read for at most ``seconds``.
    The rest is never read: closing the response then drops the connection instead of draining it."""
    parts: list[bytes] = []
    size = 0
    whole = False
    with anyio.move_on_after(seconds):
        async for chunk in response.aiter_bytes():
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                break
        else:
            whole = True
    return b"".join(parts)[:limit], whole


@asynccontextmanager
async def open_stream(client: httpx.AsyncClient, alias: str, url: httpx.URL | str, body: Mapping[str, Any],
                      headers: Mapping[str, str], secrets: Iterable[str] = (),
                      sent: Callable[[], None] | None = None) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the 2xx streaming response; every failure leaves as a ProviderError,
    including transport errors raised while the caller reads the body inside the ``with``.
    ``sent`` is called once the request is written, before the answer is read."""
    started = False
    extensions = {"trace": _on_sent(sent)} if sent is not None else None
    try:
        async with client.stream("POST", url, json=body, headers=headers, extensions=extensions) as response:
            if response.status_code >= 400:
                # Only the head: an error body says its class and a message, nothing past 64 KiB.
                raw, whole = await read_head(response, MAX_ERROR_BODY, ERROR_BODY_SECONDS)
                if log.isEnabledFor(logging.DEBUG):  # redacting costs: only for a log that keeps it
                    text = raw.decode("utf-8", errors="replace")
                    log.debug("%s: HTTP %s, body: %s", alias, response.status_code, redact(text, secrets))
                raise translate_error(alias, response.status_code, parse_body(raw, whole),
                                      response.headers)
            started = True
            yield response
    except httpx.HTTPError as exc:
        raise transport_error(alias, exc, started=started) from exc


def _on_sent(sent: Callable[[], None]) -> Callable[[str, Mapping[str, Any]], Awaitable[None]]:
    """httpcore's ``trace`` callback calling ``sent`` at the request's last byte (every other event
    of the trace is ignored)."""
    async def trace(event: str, info: Mapping[str, Any]) -> None:
        if event == REQUEST_SENT:
            sent()

    return trace


async def get_json(client: httpx.AsyncClient, method: str, url: str, *,
                   headers: Mapping[str, str], body: Any = None,
                   seconds: float = METADATA_SECONDS) -> Any:
    """A small metadata call; None on any failure, on a body over ``MAX_METADATA_BODY`` and when the
    whole call takes over ``seconds`` (discovery never raises, and never holds a turn for long)."""
    status, value = await fetch_json(client, method, url, headers=headers, body=body, seconds=seconds)
    return value if status == 200 else None


async def fetch_json(client: httpx.AsyncClient, method: str, url: str, *,
                     headers: Mapping[str, str], body: Any = None,
                     seconds: float = METADATA_SECONDS) -> tuple[int | None, Any]:
    """(HTTP status, the JSON of a 200 body or None), with ``get_json``'s bounds; the status is None
    when no answer came (a transport failure, or ``seconds`` passed)."""
    status: int | None = None
    raw, whole = b"", False
    with anyio.move_on_after(seconds):
        try:
            async with client.stream(method, url, headers=headers, json=body) as response:
                status = response.status_code
                if status == 200:
                    raw, whole = await read_head(response, MAX_METADATA_BODY, seconds)
        except httpx.HTTPError:
            return None, None
    try:
        return status, json.loads(raw) if whole else None
    except ValueError:
        return status, None


class Decoder(Protocol):
    def feed(self, data: bytes) -> Iterable[Any]: ...

    def flush(self) -> Iterable[Any]: ...


class StreamState(Protocol):
    done: bool
    budget: ReplyBudget  # what the reply may still grow by; the dialect counts tool calls against it

    def handle(self, event: Any) -> list[StreamEvent]: ...


class HttpProvider:
    """What the three HTTP dialects share: the client, URLs, and the loop that feeds decoded
    events through a dialect's stream state until it says the reply is complete."""

    kind = "http"

    def __init__(self, profile: ProviderProfile, client: httpx.AsyncClient | None = None) -> None:
        self.profile = profile
        self._owns_client = client is None
        self._client = client or build_client(profile)
        self._secrets = secrets_of(profile)
        self._stream_urls: dict[str, httpx.URL] = {}

    def _url(self, path: str) -> str:
        return self.profile.base_url.rstrip("/") + path

    def _stream_url(self, path: str) -> httpx.URL:
        """The streaming endpoint's URL, parsed once: httpx parses a URL given as text in Python on
        every request (about a tenth of building one)."""
        url = self._stream_urls.get(path)
        if url is None:
            url = self._stream_urls[path] = httpx.URL(self._url(path))
        return url

    def _headers(self) -> dict[str, str]:
        key = self.profile.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _run(self, path: str, body: Mapping[str, Any], state: StreamState,
                   decoder: Decoder, sent: Callable[[], None] | None = None
                   ) -> AsyncGenerator[StreamEvent, None]:
        # One loop from the socket to the caller, written out: every async generator between them
        # would cost a hop per event on the hottest path of a reply.
        alias, idle = self.profile.alias, self.profile.idle_timeout_seconds
        guard = TextGuard(state.budget)
        try:
            async with open_stream(self._client, alias, self._stream_url(path), body, self._headers(),
                                   self._secrets, sent) as response:
                chunks = _body_bytes(response)
                last_event = time.monotonic()
                async for chunk in chunks:
                    events, seen, failure = read_events(decoder.feed(chunk), state, guard)
                    for out in events:
                        yield out
                    if failure is not None:
                        raise failure
                    if state.done:
                        break
                    # Checked per read, not per event: a keep-alive is a read with no event.
                    if seen:
                        last_event = time.monotonic()
                    elif time.monotonic() - last_event > idle:
                        raise idle_too_long(alias, idle)
                else:
                    events, _, failure = read_events(decoder.flush(), state, guard)
                    for out in events:
                        yield out
                    if failure is not None:
                        raise failure
                if state.done:
                    await _drain(chunks)
                    return
            raise stream_ended_early(alias)
        except LineTooLong as exc:
            raise self._cleaned(ProtocolError(f"{alias}: HTTP 200, then {exc}")) from exc
        except ValueError as exc:
            raise self._cleaned(ProtocolError(f"{alias}: HTTP 200, then a part that is not JSON: {exc}")
                                ) from exc
        except ProviderError as exc:
            raise self._cleaned(exc) from exc.__cause__

    async def count_tokens(self, request: ProviderRequest) -> TokenCount | None:
        """No count endpoint unless the dialect has one."""
        return None

    def _cleaned(self, exc: ProviderError) -> ProviderError:
        """The error as a frame may show it: short, redacted; the whole text to the DEBUG log."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", redact(exc.message, self._secrets))
        exc.message = short_message(exc.message, self._secrets)
        exc.args = (exc.message,)
        return exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def read_events(decoded: Iterable[Any], state: StreamState, guard: TextGuard
                ) -> tuple[list[StreamEvent], bool, Exception | None]:
    """The events of one network read, the text deltas that follow each other joined into one (a
    read carries several only when the server fell behind the provider: the turn then emits one
    chunk frame for them, not one each); whether the decoder found any event (a keep-alive has
    none); and the failure that stopped the read, raised by the caller after the events before it,
    so the text that came before a bad part or the reply's bound is kept."""
    events: list[StreamEvent] = []
    texts: list[TextDelta] = []
    seen = False
    try:
        for event in decoded:
            seen = True
            for item in state.handle(event):
                for out in guard.events(item):
                    if type(out) is TextDelta:
                        texts.append(out)
                        continue
                    if texts:
                        events.append(joined(texts))
                        texts = []
                    events.append(out)
            if state.done:
                break
    except Exception as exc:  # raised again by the caller, after the events that came before it
        failure: Exception | None = exc
    else:
        failure = None
    if texts:  # one, unless the read carried several
        events.append(texts[0] if len(texts) == 1 else joined(texts))
    return events, seen, failure


def joined(texts: list[TextDelta]) -> TextDelta:
    return texts[0] if len(texts) == 1 else TextDelta("".join(delta.text for delta in texts))


def _body_bytes(response: httpx.Response) -> AsyncIterator[bytes]:
    # Without a content-encoding the decoded body is the raw body: skip httpx's decoder and
    # re-chunker, two generator hops per network read; on h1's connections, its stream wrappers too.
    if response.headers.get("content-encoding", "identity") == "identity":
        body = response.extensions.get(BODY)
        return body.parts() if isinstance(body, H1Body) else response.aiter_raw()
    return response.aiter_bytes()


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    # Read the body to its end so the pooled connection is kept for the next call; a response left
    # half-read costs a new TCP connection every turn.
    with anyio.move_on_after(DRAIN_SECONDS):
        async for _ in chunks:
            pass


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
