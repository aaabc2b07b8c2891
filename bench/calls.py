"""Python function calls per streamed chunk, in meterchat and in the bare relay (the same run).

CPU time per chunk on a shared 2-core machine moves with whatever else runs (docs/performance.md,
"How noisy these figures are"); the number of Python and C function calls the server makes per
chunk does not, and on this interpreter it is most of what a chunk costs (``perf`` puts about 60 %
of the server's CPU in libpython). So this counts them: the paced fake provider of bench/load.py,
then each server in a child process started as bench/load.py starts it (uvloop, no deflate) with a
profile hook (``sys.setprofile``) counting ``call`` and ``c_call`` events while one paced reply
streams (the client signals the first ``--skip`` chunks in and ``--chunks`` later out, so per-turn
work stays out), then the calls per chunk and the functions called most. A generator or coroutine
resumed counts as a call: the hops between layers are in the count. (Not quite immune to load
either: a server that falls behind joins chunks into one frame and makes fewer calls per chunk; at
one paced stream that takes a busy machine.)

    .venv/bin/python bench/calls.py                  # 300 chunks at 50 tokens/s, top 40
    .venv/bin/python bench/calls.py --chunks 600 --top 80
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadkit import procs  # noqa: E402
from bench.loadkit.relay import relay_app  # noqa: E402
from bench.loadkit.runner import meterchat_config, role_args  # noqa: E402
from bench.loadkit.wire import STAMP, ask  # noqa: E402
from server.config.load import load_settings  # noqa: E402
from server.web.app import create_app  # noqa: E402
from server.web.ws_guard import LingeringWebSocketProtocol  # noqa: E402
from tests.support import Running, client, run_server  # noqa: E402


class Counter:
    """The profile hook: counts calls by function while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.calls: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "c_call"):
            return
        self.kinds[event] += 1
        if event == "call":
            code = frame.f_code
            self.calls[f"{code.co_qualname} ({Path(code.co_filename).name})"] += 1
        else:
            self.calls[f"C {getattr(arg, '__qualname__', arg)}"] += 1


def meterchat_app(fake: str, folder: str) -> Any:
    """meterchat on the load bench's settings (``runner.meterchat_config``)."""
    return create_app(load_settings(meterchat_config(Path(folder), fake)[0], env={}))


def serve(path: str, fake: str, out: str) -> None:
    """Child process: one server, as bench/load.py starts it (uvloop, no deflate), counting calls
    between two SIGUSR1s; SIGUSR2 writes the counts to ``out``."""
    import uvicorn

    counter = Counter()
    signal.signal(signal.SIGUSR1, lambda *_: setattr(counter, "on", not counter.on))
    signal.signal(signal.SIGUSR2, lambda *_: Path(out).write_text(json.dumps(
        {"kinds": counter.kinds, "calls": counter.calls})))
    with tempfile.TemporaryDirectory() as folder:
        app = relay_app(fake + "/v1") if path == "relay" else meterchat_app(fake, folder)
        options = {"ws": LingeringWebSocketProtocol} if path == "meterchat" else {}
        sys.setprofile(counter)
        threading.setprofile(counter)  # the store's worker threads too
        uvicorn.run(app, host="127.0.0.1", port=0, log_level="info", loop="uvloop",
                    ws_per_message_deflate=False, **options)


async def stream_one(running: Running, chunks: int, skip: int) -> int:
    """One paced reply; the server counts from the provider's chunk ``skip`` to ``skip + chunks``
    (as the client sees them: the signals reach it a moment later at both ends). A chunk is what
    bench/load.py counts, one stamped token of the fake (a frame may carry several, joined by a
    server that fell behind). Returns the chunks that arrived between the two signals."""
    assert running.process is not None
    got = counted = 0
    async with client(running.address, subprotocols=["meterchat.v1"]) as ws:
        await ws.send("hello")
        await ws.until("session")
        await ws.send("message", id="q", content=ask(chunks + 2 * skip, 50))
        while (frame := await ws.recv(timeout=60))["type"] != "done":
            tokens = len(STAMP.findall(frame["content"].encode())) if frame["type"] == "chunk" else 0
            for _ in range(tokens):
                got += 1
                counted += skip < got <= skip + chunks
            if tokens and got - tokens < skip <= got or tokens and got - tokens < skip + chunks <= got:
                running.process.send_signal(signal.SIGUSR1)
    return counted


def measure(path: str, fake: str, chunks: int, skip: int, folder: str) -> dict[str, Any]:
    out = Path(folder) / f"{path}.json"
    with run_server([__file__, "--serve", path, "--fake", fake, "--out", str(out)]) as running:
        counted = anyio.run(stream_one, running, chunks, skip)
        assert running.process is not None
        running.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the child writes its counts from its signal handler
    if counted < chunks:
        raise RuntimeError(f"{path}: the reply had {counted} chunks counted, not {chunks}")
    return {**json.loads(out.read_text()), "chunks": counted}


def report(name: str, counts: dict[str, Any], top: int) -> float:
    chunks, kinds = counts["chunks"], counts["kinds"]
    calls, c_calls = kinds.get("call", 0) / chunks, kinds.get("c_call", 0) / chunks
    print(f"{name:<10} per chunk: {calls:6.1f} Python calls, {c_calls:6.1f} C calls")
    for function, count in collections.Counter(counts["calls"]).most_common(top):
        print(f"  {count / chunks:7.2f}  {function}")
    return calls + c_calls


def main(chunks: int, skip: int, top: int) -> None:
    port = procs.free_port()
    fake = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        fake_process = procs.start(role_args("fake", {"port": port, "seconds": 600}), port, None,
                                   Path(folder) / "fake.log")
        try:
            relay = measure("relay", fake, chunks, skip, folder)
            served = measure("meterchat", fake, chunks, skip, folder)
        finally:
            procs.stop(fake_process)
    print(f"{chunks} chunks of one reply at 50 tokens/s, counted after its first {skip}")
    bare = report("relay", relay, top)
    ours = report("meterchat", served, top)
    print(f"meterchat / relay, Python + C calls per chunk: {ours / bare:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--skip", type=int, default=10, help="chunks left uncounted at the start")
    parser.add_argument("--top", type=int, default=40, help="functions listed per server")
    parser.add_argument("--quick", action="store_true", help="a short run: does the bench still work")
    parser.add_argument("--serve", choices=["relay", "meterchat"], help=argparse.SUPPRESS)
    parser.add_argument("--fake", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.fake, args.out)
    elif args.quick:
        main(20, 3, 5)
    else:
        main(args.chunks, args.skip, args.top)
