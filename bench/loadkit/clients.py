"""The load clients: N sessions in one process on raw asyncio protocols (cheap enough that the
clients are not what is measured), each timing every stamped token it receives.

``direct`` sessions POST to the fake provider and read its SSE stream; ``ws`` sessions speak protocol
v1 over a WebSocket (``hello``; ``message``; ``chunk``... until ``done``) to meterchat or the bare
relay. Prints one JSON summary on stdout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, cast

from bench.loadkit import abuse
from bench.loadkit.wire import (
    END_OF_CHUNKED,
    STAMP,
    ask,
    chat_request,
    ws_frame,
    ws_frames,
    ws_json,
    ws_upgrade,
)

TAIL = 40  # longer than any stamp: the part of a read that may hold the start of the next one


@dataclass
class Plan:
    kind: str  # direct | ws
    host: str
    sessions: int
    turns: int
    tokens: int
    rate: int
    ramp: float
    timeout: float
    abuse: bool = False


@dataclass
class Stats:
    seconds: dict[int, array] = field(default_factory=dict)  # each token's delay by second of the run
    start: int = field(default_factory=time.monotonic_ns)
    first: array = field(default_factory=lambda: array("q"))
    received: int = 0
    lost: int = 0
    reordered: int = 0
    frames: int = 0
    finished: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)  # the first message of each error code
    unfinished: set[Session] = field(default_factory=set)  # still streaming: lost if the deadline comes
    created: int = 0  # sessions whose protocol object exists (connected or not)
    ready: array = field(default_factory=lambda: array("q"))  # connect -> the session frame (ws)
    streaming: int = 0  # sessions between their first token and the end of their turn, now
    peak: int = 0  # the most at once

    def this_second(self, now: int) -> array:
        """Where the delays of tokens received at ``now`` go."""
        second = (now - self.start) // 1_000_000_000
        delays = self.seconds.get(second)
        if delays is None:
            delays = self.seconds[second] = array("q")
        return delays

    def delays(self) -> array:
        return array("q", itertools.chain.from_iterable(self.seconds.values()))

    def error(self, code: str, message: str = "") -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        if message:
            self.said.setdefault(code, message[:200])


class Session(asyncio.Protocol):
    """Turn bookkeeping shared by both kinds: stamps in, delays and losses out."""

    def __init__(self, plan: Plan, stats: Stats, finished: asyncio.Future[None]) -> None:
        self.plan, self.stats, self.finished = plan, stats, finished
        self.transport: asyncio.Transport | None = None
        self.turns_left, self.expected, self.sent_at, self.got_first = plan.turns, 0, 0, False
        self.connecting = time.monotonic_ns()
        self.buffer = bytearray()
        stats.unfinished.add(self)
        stats.created += 1

    def remaining(self) -> int:
        """Tokens this session has not received yet: the rest of this turn and every later turn."""
        return max(0, self.plan.tokens - self.expected) + self.plan.tokens * (self.turns_left - 1)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.opened()

    def opened(self) -> None:
        raise NotImplementedError

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def begin_turn(self) -> None:
        self.expected, self.got_first, self.sent_at = 0, False, time.monotonic_ns()

    def stamps(self, text: bytes, now: int) -> int:
        """Record every complete stamp in ``text``; returns where the last one ended."""
        end = 0
        delays = self.stats.this_second(now)
        for found in STAMP.finditer(text):
            seq, end = int(found[1]), found.end()
            delays.append(now - int(found[2]))
            self.stats.received += 1
            if not self.got_first:
                self.got_first = True
                self.stats.first.append(now - self.sent_at)
                self.stats.streaming += 1
                self.stats.peak = max(self.stats.peak, self.stats.streaming)
            if seq > self.expected:
                self.stats.lost += seq - self.expected
            elif seq < self.expected:
                self.stats.reordered += 1
            self.expected = max(self.expected, seq + 1)
        return end

    def end_turn(self) -> None:
        if self.got_first:
            self.stats.streaming -= 1
            self.got_first = False
        self.stats.lost += max(0, self.plan.tokens - self.expected)
        self.turns_left -= 1
        if self.turns_left > 0:
            return self.next_turn()
        self.stats.finished += 1
        self.stats.unfinished.discard(self)
        self.close()

    def next_turn(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.turns_left > 0 and self in self.stats.unfinished:
            self.stats.error("connection_lost")
            self.stats.lost += self.remaining()
            self.stats.unfinished.discard(self)
        if not self.finished.done():
            self.finished.set_result(None)


class DirectSession(Session):
    """Reads the fake's SSE stream itself (the floor every relay is compared with)."""

    def opened(self) -> None:
        self.next_turn()

    def next_turn(self) -> None:
        self.begin_turn()
        self.in_head = True
        self.send(chat_request(self.plan.host, self.plan.tokens, self.plan.rate))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buffer += data
        if self.in_head:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buffer[:end + 4]
            self.in_head = False
        text = bytes(self.buffer)
        last = self.stamps(text, now)
        self.buffer = bytearray(text[max(last, len(text) - TAIL):])
        if text.endswith(END_OF_CHUNKED):
            self.buffer.clear()
            self.end_turn()


class SocketSession(Session):
    """Speaks protocol v1 to meterchat (or the bare relay) over a WebSocket."""

    def opened(self) -> None:
        self.upgraded = False
        self.send(ws_upgrade(self.plan.host))

    def next_turn(self) -> None:
        self.begin_turn()
        self.send(ws_json({"type": "message", "id": os.urandom(8).hex(),
                           "content": ask(self.plan.tokens, self.plan.rate)}))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buffer += data
        if not self.upgraded and not self.upgrade():
            return
        for opcode, payload in ws_frames(self.buffer):
            self.on_frame(opcode, payload, now)

    def upgrade(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        if b" 101 " not in self.buffer[:end]:
            self.stats.error("upgrade_refused")
            self.close()
            return False
        del self.buffer[:end + 4]
        self.upgraded = True
        self.send(ws_json({"type": "hello"}))
        return True

    def on_frame(self, opcode: int, payload: bytes, now: int) -> None:
        if opcode == 9:
            return self.send(ws_frame(payload, 10))
        if opcode == 8:
            return self.close()
        self.stats.frames += 1
        frame: dict[str, Any] = json.loads(payload)
        kind = frame.get("type")
        if kind == "chunk":
            self.stamps(frame["content"].encode(), now)
        elif kind == "session":
            self.stats.ready.append(now - self.connecting)
            self.next_turn()
        elif kind == "done":
            self.end_turn()
        elif kind == "aborted":  # stopped by the server (a lost lease, a drain): not held, but ended
            self.stats.error("aborted")
            self.end_turn()
        elif kind == "error":
            self.stats.error(str(frame.get("code")), str(frame.get("message", "")))
            if "turn_id" in frame or "message_id" in frame:
                self.end_turn()


async def connect(plan: Plan, stats: Stats, delay: float) -> None:
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    kind = DirectSession if plan.kind == "direct" else SocketSession
    host, port = plan.host.rsplit(":", 1)
    try:
        await loop.create_connection(lambda: kind(plan, stats, finished), host, int(port))
    except OSError as exc:
        stats.error(f"connect: {type(exc).__name__}")  # its tokens are counted lost by run()
        return
    await finished


async def run(plan: Plan) -> tuple[Stats, dict[str, Any]]:
    stats = Stats()
    mix = await abuse.start(plan.host, plan.tokens * 10) if plan.abuse and plan.kind == "ws" else None
    tasks = [asyncio.ensure_future(connect(plan, stats, i * plan.ramp / max(1, plan.sessions)))
             for i in range(plan.sessions)]
    done, pending = await asyncio.wait(tasks, timeout=plan.timeout)
    for task in pending:  # bounded in time: a session still open at the deadline is a failure
        task.cancel()
    for _ in pending:
        stats.error("deadline")
    for session in stats.unfinished:
        stats.lost += session.remaining()
    stats.lost += (plan.sessions - stats.created) * plan.tokens * plan.turns  # never got that far
    return stats, (await mix.finish() if mix else {})


def percentiles(values: array) -> dict[str, float]:
    """p50 / p99 / max in milliseconds (nanoseconds in)."""
    ordered = sorted(values)
    if not ordered:
        return {}
    pick = lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": ordered[-1] / 1e6, "count": len(ordered)}


def main(plan_json: str) -> None:
    from bench.loadkit.procs import fast_loop

    plan = Plan(**json.loads(plan_json))
    started, cpu = time.monotonic(), os.times()
    stats, abusers = fast_loop().run_until_complete(run(plan))
    used = os.times()
    summary = {"delay": percentiles(stats.delays()), "first": percentiles(stats.first),
               "ready": percentiles(stats.ready), "peak": stats.peak,
               "by_second": [percentiles(stats.seconds[s]).get("p99") for s in sorted(stats.seconds)],
               "received": stats.received, "lost": stats.lost, "reordered": stats.reordered,
               "frames": stats.frames, "finished": stats.finished, "errors": stats.errors, "said": stats.said,
               "wall": time.monotonic() - started, "abuse": abusers,
               "client_cpu": max(0.0, used.user + used.system - cpu.user - cpu.system)}
    print(json.dumps(summary))
