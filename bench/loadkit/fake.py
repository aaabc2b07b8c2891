"""The paced fake provider: an OpenAI-compatible ``/v1/chat/completions`` (SSE over chunked
HTTP/1.1, keep-alive) and ``/v1/models``, on raw asyncio protocols so that a thousand paced streams
cost the fake little of the core it shares with the clients.

The user message names the reply (``tokens=K rate=R``, see ``wire.ask``). One ticker walks every
open stream each millisecond or so and writes the tokens that are due, each stamped at the moment
it is written.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

from bench.loadkit.wire import parse_ask, token

TICK = 0.002
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
DELTA = ('data: {"id":"b","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
         '"delta":{"content":"%s"},"finish_reason":null}]}\n\n')
TAIL = ('data: {"id":"b","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        '"delta":{},"finish_reason":"stop"}]}\n\n'
        'data: {"id":"b","object":"chat.completion.chunk","model":"m","choices":[],'
        '"usage":{"prompt_tokens":20,"completion_tokens":%d,"total_tokens":%d}}\n\n'
        'data: [DONE]\n\n')


def chunked(text: str) -> bytes:
    data = text.encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stream:
    """One reply being written: ``sent`` tokens so far, the next due at ``due`` (ns)."""

    def __init__(self, conn: FakeConnection, tokens: int, rate: int) -> None:
        self.conn, self.tokens, self.sent = conn, tokens, 0
        self.step = 1_000_000_000 // rate if rate else 0
        self.due = time.monotonic_ns()

    def pump(self, now: int) -> bool:
        """Write what is due; true when the reply is complete."""
        pieces = []
        while self.sent < self.tokens and self.due <= now:
            pieces.append(chunked(DELTA % token(self.sent, time.monotonic_ns())))
            self.sent += 1
            self.due += self.step
        if self.sent >= self.tokens:
            pieces.append(chunked(TAIL % (self.tokens, self.tokens + 20)) + b"0\r\n\r\n")
        if pieces:
            self.conn.write(b"".join(pieces))
        return self.sent >= self.tokens


class FakeConnection(asyncio.Protocol):
    def __init__(self, streams: set[Stream]) -> None:
        self.streams, self.buffer = streams, bytearray()
        self.transport: asyncio.Transport | None = None
        self.stream: Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.streams.discard(self.stream)
        self.transport = None

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (request := self.take_request()) is not None:
            self.answer(*request)

    def take_request(self) -> tuple[str, bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return None
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        return head[0], body

    def answer(self, request_line: str, body: bytes) -> None:
        if request_line.startswith("GET /v1/models"):
            return self.json({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if not request_line.startswith("POST /v1/chat/completions"):
            return self.json({"error": {"message": "not found"}}, "404 Not Found")
        tokens, rate = parse_ask(last_user_text(json.loads(body)))
        self.write(HEAD)
        self.stream = Stream(self, tokens, rate)
        if not self.stream.pump(time.monotonic_ns()):
            self.streams.add(self.stream)

    def json(self, value: Any, status: str = "200 OK") -> None:
        data = json.dumps(value).encode()
        self.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (status.encode(), len(data), data))


def last_user_text(body: Any) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


async def tick(streams: set[Stream]) -> None:
    while True:
        now = time.monotonic_ns()
        for stream in [s for s in streams if s.due <= now]:
            if stream.pump(now):
                streams.discard(stream)
        await asyncio.sleep(TICK)


async def serve(port: int, seconds: float) -> None:
    streams: set[Stream] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeConnection(streams), "127.0.0.1", port, backlog=4096)
    ticker = asyncio.create_task(tick(streams))
    async with server:
        await asyncio.sleep(seconds)  # bounded: the fake stops by itself if the bench dies
    ticker.cancel()
