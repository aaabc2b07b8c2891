"""Fuzz the client protocol against a real server over a real WebSocket.

    python bench/fuzz.py [--frames 100000] [--seed N] [--window 4096] [--reuse-stored-ids] [--quick]

Hypothesis generates batches of hostile frames (random text and bytes, nesting up to 200,000 deep,
integers of thousands of digits, unicode edge cases and lone surrogates, every frame type with wrong
fields, and some valid frames so turns run too) and sends them to the real app (uvicorn on
127.0.0.1 in a thread) over one session. After each batch a sentinel frame (an unknown type) must
come back as an error: the connection is alive and every frame before it was answered. Prints the
frame count, dropped connections (with the batch that dropped), errors by code, log records with a
traceback, frames/s, and whether the session still answers a normal message. ``tests/test_fuzz.py``
runs the same loop for a few thousand frames.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server.protocol import CLIENT_FRAMES  # noqa: E402

Frame = str | bytes
# In a frame, this string stands for an id the server already stored in the session (a message id
# from ``accepted`` or ``history``), or, without --reuse-stored-ids, for a fresh one.
STORED_ID = "@stored-id@"
EDGE_TEXT = ["", " ", "\x00", "\ud800", "\udfff", "a\ud83d", "\ude00b", "\ufeff", "\u202e", "\uffff",
             "\U0010ffff", "e\u0301", "\u200d", "\r\n", "/model", "/model demo", "/hint", "/hint x y",
             "/model \ud800", "demo", "demo/demo-open", "demo/" + "m" * 300, "x" * 5000, STORED_ID]
ALL_FIELDS = sorted({name.rstrip("?") for spec in CLIENT_FRAMES.values() for name in spec})


def _dump(value: Any) -> str:
    # ensure_ascii: lone surrogates travel as \\ud800 escapes (raw, they cannot be UTF-8 on the wire)
    return json.dumps(value, ensure_ascii=True, allow_nan=True)


def hostile_values() -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50)
               | st.sampled_from(EDGE_TEXT) | st.integers(min_value=-(2**64), max_value=2**64))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)


def typed_frames() -> st.SearchStrategy[Frame]:
    """Every frame type (and a few that are not) with any subset of fields holding any values."""
    kinds = st.sampled_from([*CLIENT_FRAMES, "Hello", "", "\ud800", "message ", "x" * 300])
    return st.builds(lambda kind, fields: _dump({"type": kind, **fields}), kinds,
                     st.dictionaries(st.sampled_from(ALL_FIELDS), hostile_values(), max_size=5))


def valid_frames() -> st.SearchStrategy[Frame]:
    ids = st.uuids().map(str) | st.just(STORED_ID)
    message = st.fixed_dictionaries({"type": st.just("message"), "id": ids,
                                     "content": st.sampled_from(["hi", "tell me more", "/model demo",
                                                                 "/hint x hello", "\U0001F600 ok"])})
    switch = st.fixed_dictionaries({"type": st.just("switch_model"),
                                    "route": st.sampled_from(["demo", "demo/demo-open", "nope", ""])})
    return (message | switch | st.just({"type": "stop"})).map(_dump)


def _nested(depth: int, opener: str, closer: str) -> str:
    return opener * depth + closer * depth


def structural_frames() -> st.SearchStrategy[Frame]:
    depth = st.integers(min_value=1, max_value=200_000)
    digits = st.integers(min_value=4000, max_value=20_000).map(lambda n: "9" * n)
    return st.one_of(
        depth.map(lambda d: _nested(d, "[", "]")),
        depth.map(lambda d: '{"type": "message", "id": "n", "content": ' + _nested(d, "[", "]") + "}"),
        depth.map(lambda d: '{"a":' * d + "1" + "}" * d),
        digits.map(lambda n: '{"type": "hello", "last_seq": ' + n + "}"),
        digits.map(lambda n: '{"type": "message", "id": "i", "content": "x", "images": [' + n + "]}"),
        st.sampled_from(['{"type": "hello", "last_seq": NaN}', '{"type": "hello", "last_seq": -Infinity}',
                         '{"type": "hello", "last_seq": 1e400}', '{"type": "stop"', "{}", "[]", "null"]),
    )


def frames() -> st.SearchStrategy[Frame]:
    return st.one_of(
        st.text(alphabet=st.characters(codec="utf-8"), max_size=200),
        st.binary(max_size=200),
        typed_frames(), typed_frames(), typed_frames(),
        structural_frames(),
        valid_frames(),
    )


def batches() -> st.SearchStrategy[tuple[bool, list[Frame]]]:
    """(fresh connection?, frames): a fresh connection gets its frames before any hello."""
    return st.tuples(st.sampled_from([False] * 9 + [True]), st.lists(frames(), min_size=1, max_size=12))


class LogCapture(logging.Handler):
    """Every record at WARNING or above, from the app and from uvicorn (which does not propagate).
    Enter it after the server started: uvicorn's logging set-up removes the handlers it finds."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def tracebacks(self) -> list[logging.LogRecord]:
        return [r for r in self.records if r.exc_info or "Traceback" in r.getMessage()]

    def __enter__(self) -> LogCapture:
        for name in ("", "uvicorn", "uvicorn.error"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("", "uvicorn", "uvicorn.error"):
            logging.getLogger(name).removeHandler(self)


@dataclass
class FuzzRun:
    """One fuzzing client: a session, a connection, and what happened."""

    address: str
    frames: int = 0
    batches: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    drops: list[str] = field(default_factory=list)
    session_id: str | None = None
    reuse_stored_ids: bool = False
    stored_ids: list[str] = field(default_factory=list)
    ws: ClientConnection | None = None
    stack: ExitStack = field(default_factory=ExitStack)

    def run_batch(self, fresh: bool, batch: list[Frame]) -> None:
        self.batches += 1
        batch = [self.with_ids(frame) for frame in batch]
        try:
            self._send_batch(fresh, batch)
        except ConnectionClosed as exc:
            self.drops.append(f"{exc!r} after batch {self.batches}: {[f[:120] for f in batch]!r}")
            self.ws = None

    def _send_batch(self, fresh: bool, batch: list[Frame]) -> None:
        if fresh or self.ws is None:
            self.close()
            self.ws = self.stack.enter_context(connect(f"ws://{self.address}/ws", max_size=None))
            if not fresh:
                self.hello()
        for frame in batch:
            self.ws.send(frame)
            self.frames += 1
        opened = self.drain(f"fuzz-sentinel-{self.batches}")
        if fresh and not opened:
            self.hello()

    def with_ids(self, frame: Frame) -> Frame:
        if isinstance(frame, bytes) or STORED_ID not in frame:
            return frame
        if self.reuse_stored_ids and self.stored_ids:
            return frame.replace(STORED_ID, self.stored_ids[self.frames % len(self.stored_ids)])
        return frame.replace(STORED_ID, uuid.uuid4().hex)

    def hello(self) -> None:
        assert self.ws is not None
        self.ws.send(_dump({"type": "hello", **({"session_id": self.session_id} if self.session_id else {})}))
        self.drain(f"fuzz-sentinel-hello-{self.batches}")

    def drain(self, marker: str) -> bool:
        """Send the sentinel and read up to its answer; True when a session frame came on the way."""
        assert self.ws is not None
        self.ws.send(_dump({"type": marker}))
        opened = False
        while True:
            frame = json.loads(self.ws.recv(timeout=30))
            if frame["type"] == "session":
                opened = True
                self.session_id = self.session_id or frame["session_id"]
            self.remember_ids(frame)
            if frame["type"] != "error":
                continue
            if marker in frame["message"]:
                return opened
            self.errors[frame["code"]] += 1

    def remember_ids(self, frame: dict[str, Any]) -> None:
        if frame["type"] == "history":
            self.stored_ids = [message["id"] for message in frame["messages"]][-1000:]
        elif frame["type"] == "accepted" and len(self.stored_ids) < 1000:
            self.stored_ids.append(frame["id"])

    def close(self) -> None:
        self.stack.close()
        self.ws = None

    def session_answers(self) -> str:
        """How the fuzzed session answers a normal message (after any turn still running):
        ``done`` when it is usable."""
        self.close()
        with connect(f"ws://{self.address}/ws", max_size=None) as ws:
            ws.send(_dump({"type": "hello", "session_id": self.session_id}))
            ws.send(_dump({"type": "stop"}))
            for attempt in range(50):
                message_id = f"after-fuzz-{attempt}-{time.time_ns()}"
                ws.send(_dump({"type": "message", "id": message_id, "content": "are you still there?"}))
                outcome = _turn_outcome(ws, message_id)
                if outcome != "busy":
                    return outcome
        return "busy"

    def report(self, seconds: float, logs: LogCapture) -> str:
        codes = ", ".join(f"{code} {count}" for code, count in self.errors.most_common())
        lines = [f"frames sent: {self.frames} in {self.batches} batches, {seconds:.1f} s "
                 f"({self.frames / seconds:,.0f} frames/s)",
                 f"dropped connections: {len(self.drops)}", f"errors by code: {codes}",
                 f"log records with a traceback: {len(logs.tracebacks)}",
                 f"log records at warning or above: {len(logs.records)}"]
        lines += [f"  drop: {drop[:600]}" for drop in self.drops[:10]]
        lines += [f"  log: {r.getMessage().strip()[:200]}: {_cause(r)}" for r in logs.tracebacks[:10]]
        return "\n".join(lines)


def _cause(record: logging.LogRecord) -> str:
    """The innermost exception of a logged traceback (a task group wraps it in a group)."""
    exc = record.exc_info[1] if record.exc_info else None
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return repr(exc)[:300]


def _turn_outcome(ws: ClientConnection, message_id: str) -> str:
    """This message's fate: ``done``, an error code, or ``busy`` once the turn in the way ended."""
    turn_id, busy = None, False
    while True:
        frame = json.loads(ws.recv(timeout=30))
        kind = frame["type"]
        if kind == "accepted" and frame["id"] == message_id:
            turn_id = frame["turn_id"]
        elif kind == "error" and frame.get("message_id") == message_id:
            if frame["code"] != "busy":
                return f"{frame['code']}: {frame['message'][:300]}"
            busy = True
        elif kind in ("done", "aborted", "error") and frame.get("turn_id"):
            if frame["turn_id"] == turn_id:
                return f"{frame['code']}: {frame['message'][:300]}" if kind == "error" else kind
            if busy:
                return "busy"


def fuzz(run: FuzzRun, examples: int, seed: int | None = None) -> None:
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(batches())
    def one(batch: tuple[bool, list[Frame]]) -> None:
        run.run_batch(*batch)

    if seed is not None:
        from hypothesis import seed as with_seed

        one = with_seed(seed)(one)
    one()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="about a second: 300 frames")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--window", type=int, default=4096,
                        help="the demo model's context window (the demo's own is 4096)")
    parser.add_argument("--reuse-stored-ids", action="store_true",
                        help="send messages under ids the session already stored (drops today: hub.py)")
    args = parser.parse_args()
    if args.quick:
        args.frames = 300
    from tests.support import DEMO, serve, settings_for

    with tempfile.TemporaryDirectory() as folder:
        # The capture joins after start-up: uvicorn's logging set-up removes handlers it finds.
        demo = {"providers": {"demo": {**DEMO, "context_window": args.window}}}
        # As fast as it can: the frame-rate limit is lifted (it answers a flood with rate_limited).
        with serve(settings_for(Path(folder), demo, frame_rate=1e9, frame_burst=1_000_000)) as address, \
                LogCapture() as logs:
            run = FuzzRun(address, reuse_stored_ids=args.reuse_stored_ids)
            started = time.perf_counter()
            rounds = 0
            while run.frames < args.frames:
                seed = None if args.seed is None else args.seed + rounds
                # Rounds of 1,000 batches: one long hypothesis run caches what it generated (GBs here).
                fuzz(run, examples=min(1000, max(100, (args.frames - run.frames) // 6)), seed=seed)
                rounds += 1
            seconds = time.perf_counter() - started
            usable = run.session_answers()
        print(run.report(seconds, logs))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process (server and fuzzer together): {peak:,.0f} MiB")
        print(f"a normal message afterwards: {usable} ({'usable' if usable == 'done' else 'NOT usable'})")


if __name__ == "__main__":
    main()
