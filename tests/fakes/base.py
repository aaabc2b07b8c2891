"""What every fake provider shares: the scripted ``Reply``, the request record, the byte splitter
and a uvicorn server on 127.0.0.1 port 0 in a background thread (as httpx's own tests do)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from server.providers.base import TextDelta
from tests.support import run_server

AUTO = "auto"
ENDLESS_WORDS = "lorem ipsum dolor sit amet " * 38  # about 1 KiB of prose: one endless delta
ENDLESS = 1 << 62  # an error_size no body reaches: the body never ends


@dataclass(frozen=True)
class Call:
    """A scripted tool call; ``id`` empty means the dialect's fake makes one (Ollama sends none)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """One scripted answer to one chat request.

    ``usage`` is ``(input_tokens, output_tokens)``, ``None`` to omit it, or ``"auto"`` (input =
    request bytes / 4, output = pieces sent). ``status >= 400`` answers with an error in the
    dialect's shape (``error`` message, ``error_type``, ``error_code``) or with ``body`` verbatim.
    ``stream_error`` sends a dialect error event after the pieces. ``ending``: ``"complete"``,
    ``"drop"`` (the connection is cut after the pieces) or ``"close"`` (a clean close without the
    terminator). ``delay`` seconds pass between pieces. ``raw`` bytes are sent as the whole body.
    ``hold``: the stream pauses after the pieces until the test sets this event (a stream that hangs
    mid-reply, for "stop" tests without timing). ``keepalive``: after the pieces, only keep-alives
    (an SSE comment, an empty NDJSON line) every that many seconds until the client goes away.
    ``error_size``: an error body padded with ``error_fill`` (whitespace by default) to that many
    bytes, made as it is sent (``fake.error_bytes_sent`` counts what left); ``ENDLESS`` never ends.
    ``endless``: ``"text"``, ``"thinking"`` or ``"arguments"``: after the pieces, deltas of that kind
    (tool-call argument fragments of one call; Ollama: whole calls, one a line) without end, until the
    client goes (``fake.endless_bytes_sent`` counts what left, ``fake.endless_ended`` is set then).
    """

    text: Sequence[str] = ()
    thinking: Sequence[str] = ()
    tool_calls: Sequence[Call] = ()
    usage: tuple[int, int] | str | None = AUTO
    finish: str | None = None
    model: str | None = None
    status: int = 200
    error: str = "scripted error"
    error_type: str | None = None
    error_code: str | int | None = None
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    stream_error: str | None = None
    ending: str = "complete"
    delay: float = 0.0
    raw: bytes | None = None
    cache: tuple[int, int] = (0, 0)  # anthropic only: cache_creation / cache_read input tokens
    hold: threading.Event | None = None  # after the pieces, wait until the test sets it
    keepalive: float = 0.0
    error_size: int = 0
    error_fill: bytes = b" "
    endless: str = ""


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    json: Any
    peer: int | None = None  # the client's port: the same port means the connection was reused


def json_text(data: Any) -> str:
    """JSON as providers send it: UTF-8 text, except that a lone surrogate (which UTF-8 cannot hold)
    goes out as a ``\\ud83d`` escape, as a provider that split an emoji's pair sends it."""
    text = json.dumps(data, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(data)
    return text


def words(text: str) -> list[str]:
    """``text`` cut into word pieces that join back to it."""
    return re.findall(r"\S+\s*|\s+", text) or [text]


def json_pieces(value: Any, parts: int = 3) -> list[str]:
    """``value`` as JSON text cut into ``parts`` fragments (to exercise fragment joining)."""
    text = json.dumps(value)
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Dropped(Exception):
    """Raised inside a streaming body so uvicorn cuts the connection mid-stream."""


def resplit(chunks: Sequence[bytes], split: int | Sequence[int] | None,
            flush_each: bool) -> Iterator[bytes]:
    """Re-cut a byte stream into pieces of the ``split`` sizes (cycled); sizes as small as 1 cut
    UTF-8 characters and ``\\r\\n`` pairs. ``flush_each`` keeps piece borders (for delays)."""
    if split is None:
        yield from (chunk for chunk in chunks if chunk)
        return
    sizes = itertools.cycle([split] if isinstance(split, int) else list(split))
    pending = b""
    for chunk in chunks:
        pending += chunk
        while pending:
            size = next(sizes)
            if len(pending) < size and not flush_each:
                break
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


class FakeProvider:
    """A scriptable provider behind a real HTTP server; subclasses speak one dialect."""

    dialect = "fake"
    media_type = "text/event-stream"

    def __init__(self) -> None:
        self.base_url = ""
        self._queue: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.meta_requests: list[Recorded] = []
        self.split: int | Sequence[int] | None = None
        self.newline = "\n"
        self.models: dict[str, dict[str, Any]] = {}
        self.api_key: str | None = None
        self.default: Callable[[Any], Reply] | None = None
        self.error_bytes_sent = 0
        self.endless_bytes_sent = 0
        self.endless_ended = threading.Event()
        self.meta_flood: tuple[bytes, bytes, int] | None = None
        self.drip = 0.0  # > 0: floods go out one fill at a time, this many seconds apart
        self.counter: str | None = None  # the count endpoint this fake serves (None: every one 404s)
        self.count_window = 8192  # the window a count answer names, where the real one does
        self.count_requests: list[Recorded] = []
        self.count_hold: threading.Event | None = None  # count endpoints answer once it is set

    def enqueue(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    script = enqueue

    @property
    def pending(self) -> int:
        return len(self._queue)

    def reset(self) -> None:
        self._queue.clear()
        self.requests.clear()
        self.meta_requests.clear()
        self.split = None
        self.newline = "\n"
        self.models = {}
        self.api_key = None
        self.default = None
        self.error_bytes_sent = 0
        self.endless_bytes_sent = 0
        self.endless_ended = threading.Event()
        self.meta_flood = None
        self.drip = 0.0
        self.counter = None
        self.count_window = 8192
        self.count_requests.clear()
        self.count_hold = None

    def next_reply(self, body: Any) -> Reply:
        if self._queue:
            return self._queue.popleft()
        if self.default is not None:
            return self.default(body)
        return Reply(text=words(f"echo: {self.last_user_text(body)}"))

    async def record(self, request: Request, into: list[Recorded]) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", errors="replace")
        peer = request.client.port if request.client else None
        into.append(Recorded(request.method, request.url.path, dict(request.headers), body, peer))
        return body

    async def chat(self, request: Request) -> Response:
        body = await self.record(request, self.requests)
        problem = self.check(request, body)
        if problem is not None:
            return problem
        reply = self.next_reply(body)
        if reply.status >= 400:
            return self.error_response(reply)
        if reply.raw is not None:
            return self.streaming([reply.raw], [], reply)
        head, tail = self.render(reply, body)
        return self.streaming(head, tail, reply)

    def streaming(self, head: list[bytes], tail: list[bytes], reply: Reply) -> Response:
        return StreamingResponse(self._body(head, tail, reply), media_type=self.media_type,
                                 headers=dict(reply.headers))

    async def _body(self, head: list[bytes], tail: list[bytes], reply: Reply) -> AsyncIterator[bytes]:
        ending = tail if reply.ending == "complete" and not reply.endless else []
        if reply.stream_error is not None:
            ending = [self.stream_error_event(reply)]
        chunks = head + ending
        if reply.delay or reply.hold:  # each piece on its own, a pause between pieces
            for index, event in enumerate(head):
                if index and reply.delay:
                    await asyncio.sleep(reply.delay)
                for piece in resplit([event], self.split, flush_each=True):
                    yield piece
            chunks = ending
            while reply.hold is not None and not reply.hold.is_set():
                await asyncio.sleep(0.005)
        for piece in resplit(chunks, self.split, flush_each=False):
            yield piece
        if reply.endless:
            async for block in self._endless(reply.endless):
                yield block
        if reply.ending == "drop" and reply.stream_error is None:
            raise _Dropped("scripted connection drop")
        while reply.keepalive:  # ends when the client goes away and uvicorn cancels this body
            await asyncio.sleep(reply.keepalive)
            yield self.keepalive_bytes()

    async def _endless(self, kind: str) -> AsyncIterator[bytes]:
        """Deltas of ``kind`` forever, 64 KiB at a time; ends only when the client goes (uvicorn then
        cancels the body), which ``endless_ended`` tells the test."""
        try:
            start = self.endless_start(kind)
            if start:
                yield start
            piece = self.endless_piece(kind)
            block = piece * max(1, 65536 // len(piece))
            while True:
                self.endless_bytes_sent += len(block)
                yield block
                await asyncio.sleep(0)  # lets Starlette see the client go (see _padded)
        finally:
            self.endless_ended.set()

    def endless_start(self, kind: str) -> bytes:
        """What opens an endless run of ``kind`` (a tool call's first fragment, a content block)."""
        return b""

    def endless_piece(self, kind: str) -> bytes:
        """One delta of ``kind``, as the dialect streams it."""
        raise NotImplementedError

    def flood(self) -> Response:
        """The metadata answer ``meta_flood = (head, item, size)`` asks for: ``head`` then ``item``
        again and again up to ``size`` bytes (``ENDLESS``: forever), a JSON text that never closes."""
        assert self.meta_flood is not None
        head, item, size = self.meta_flood

        async def body() -> AsyncIterator[bytes]:
            sent = len(head)
            yield head
            block = item if self.drip else item * max(1, 65536 // len(item))
            while sent < size:
                sent += len(block)
                self.error_bytes_sent += len(block)
                yield block
                await asyncio.sleep(self.drip)  # lets Starlette see the client go (see _padded)

        return StreamingResponse(body(), media_type="application/json")

    async def count_wait(self) -> None:
        while self.count_hold is not None and not self.count_hold.is_set():
            await asyncio.sleep(0.005)

    @staticmethod
    def count_of(value: Any) -> int:
        """The fakes' tokenizer for count endpoints: a token per 3 bytes of the JSON (or text)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return max(1, len(text.encode()) // 3)

    def keepalive_bytes(self) -> bytes:
        return f": keep-alive{self.newline}{self.newline}".encode()

    def auto_usage(self, reply: Reply, body: Any) -> tuple[int, int] | None:
        if reply.usage != AUTO:
            return reply.usage  # type: ignore[return-value]
        size = len(json.dumps(body).encode("utf-8"))
        return max(1, size // 4), len(reply.text) + len(reply.thinking) + len(reply.tool_calls)

    def error_json(self, status: int, content: Any, headers: Mapping[str, str] | None = None) -> Response:
        if isinstance(content, str):
            return Response(content, status_code=status, headers=dict(headers or {}))
        return JSONResponse(content, status_code=status, headers=dict(headers or {}))

    def error_response(self, reply: Reply) -> Response:
        content = reply.body if reply.body is not None else self.error_body(reply)
        if reply.error_size:
            return StreamingResponse(self._padded(content, reply.error_size, reply.error_fill),
                                     status_code=reply.status,
                                     media_type="application/json", headers=dict(reply.headers))
        return self.error_json(reply.status, content, reply.headers)

    async def _padded(self, content: Any, size: int, fill: bytes) -> AsyncIterator[bytes]:
        head = (content if isinstance(content, str) else json.dumps(content)).encode()
        self.error_bytes_sent += len(head)
        yield head
        pad = fill if self.drip else (fill * (65536 // len(fill) + 1))[:65536]
        while self.error_bytes_sent < size:
            self.error_bytes_sent += len(pad)
            yield pad
            # Once the client has gone uvicorn drops writes without waiting; yielding to the loop lets
            # Starlette see the disconnect and stop this body, so the count is what the client let in.
            await asyncio.sleep(self.drip)

    def sse(self, data: Any, event: str | None = None) -> bytes:
        nl = self.newline
        text = data if isinstance(data, str) else json_text(data)
        head = f"event: {event}{nl}" if event else ""
        return f"{head}data: {text}{nl}{nl}".encode()

    # Each dialect fills these in.
    def routes(self) -> list[Any]:
        raise NotImplementedError

    def check(self, request: Request, body: Any) -> Response | None:
        return None

    def render(self, reply: Reply, body: Any) -> tuple[list[bytes], list[bytes]]:
        raise NotImplementedError

    def error_body(self, reply: Reply) -> Any:
        raise NotImplementedError

    def stream_error_event(self, reply: Reply) -> bytes:
        raise NotImplementedError

    def last_user_text(self, body: Any) -> str:
        raise NotImplementedError

    def app(self) -> Starlette:
        return Starlette(routes=self.routes())


def _not_a_scripted_drop(record: logging.LogRecord) -> bool:
    # A scripted drop is the test's intent, not a server fault worth a traceback in the log.
    return not (record.exc_info and isinstance(record.exc_info[1], _Dropped))


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1, a free port; yields ``http://127.0.0.1:PORT``."""
    logging.getLogger("uvicorn.error").addFilter(_not_a_scripted_drop)
    with run_server(app, lifespan="off", ws="none", http="h11") as server:
        yield server.url


@contextmanager
def running(fake: FakeProvider, suffix: str = "") -> Iterator[FakeProvider]:
    """Serve ``fake`` and set its ``base_url`` (with the dialect's ``suffix``, e.g. ``/v1``)."""
    with serve_in_thread(fake.app()) as root:
        fake.base_url = root + suffix
        yield fake


async def drain(stream: AsyncIterator[Any]) -> tuple[list[Any], BaseException | None]:
    """Every event of a provider stream and the error that ended it (None when it finished)."""
    events: list[Any] = []
    try:
        async for event in stream:
            events.append(event)
    except Exception as exc:  # the caller asserts on the class; anything else would hide it
        return events, exc
    return events, None


def joined(events: list[Any]) -> list[Any]:
    """``events`` with each run of text deltas joined into one: the provider layer joins the deltas
    one network read carried, so how many it yields depends on how the bytes arrived."""
    out: list[Any] = []
    for event in events:
        if type(event) is TextDelta and out and type(out[-1]) is TextDelta:
            out[-1] = TextDelta(out[-1].text + event.text)
        else:
            out.append(event)
    return out
