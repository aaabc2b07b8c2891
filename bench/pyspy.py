"""Profile the servers of a load run with py-spy: where each server's CPU goes, by layer.

    .venv/bin/pip install py-spy                    # a tool, not a dependency of the project
    .venv/bin/python bench/pyspy.py               # 100 paced sessions, relay then meterchat
    .venv/bin/python bench/pyspy.py --sessions 100 --seconds 20 --record 10 --pin

    .venv/bin/python bench/pyspy.py --steps --paths meterchat --sessions '' --first-chunk 1,1,1 --after 1.5

Runs ``bench/load.py`` (direct path skipped; no first-chunk mode unless given) and attaches ``py-spy
record`` to each server as it starts, once the bench's warm-up and the ramp are over, for ``--record``
seconds (or until the server ends).
Prints the load bench's table, then for each server its samples by layer: each sample goes to the
layer of the innermost Python frame (so ``json`` is json wherever it is called from), and a second
table counts the samples under a few meterchat entry points (inclusive). Idle time (the loop
waiting in epoll) is not sampled by py-spy; native code shows as the Python frame that called it
(uvloop's own loop as ``asyncio runner``). ``--steps`` adds the samples by step of a turn (message
in, trims, meter, store, provider call, ...): the per-turn work of the first-chunk mode. py-spy needs
root or ptrace permission. The raw stacks are kept in ``--out`` (collapsed format, for flame graph
tools).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (layer, substrings of a frame "function (file:line)"), first match wins; order matters.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("json", ("(json/",)),
    ("SSE decoding (decoders.py)", ("providers/decoders.py",)),
    ("provider dialect + text guard", ("providers/openai.py", "providers/text.py", "providers/base.py")),
    ("provider read loop (_http.py)", ("providers/_http.py",)),
    ("provider network backend (transport.py)", ("providers/transport.py",)),
    ("provider HTTP/1.1 (h1.py + httptools)", ("providers/h1",)),
    ("channel: emit, frame log, outbox", ("server/sessions/channel.py", "server/sessions/events.py")),
    ("reply writer + flusher", ("server/sessions/reply.py", "server/sessions/flusher.py", "server/store")),
    ("turn + session", ("server/sessions/turn.py", "server/sessions/session.py", "server/sessions/hub.py",
                        "server/sessions/cache.py", "server/sessions/restore.py",
                        "server/sessions/unsaved.py")),
    ("connection: writer, coalescing", ("server/web/connection.py",)),
    ("bench relay code", ("loadkit/relay.py",)),
    ("httpx", ("(httpx/",)),
    ("httpcore", ("(httpcore/",)),
    ("h11 (response parsing)", ("(h11/",)),
    ("anyio", ("(anyio/",)),
    ("websocket send/receive (uvicorn + websockets)", ("protocols/websockets", "(websockets/",
                                                       "server/web/ws_guard.py")),
    ("starlette", ("(starlette/",)),
    ("uvicorn (other)", ("(uvicorn/",)),
    ("asyncio (streams, tasks, events)", ("(asyncio/",)),
    ("sqlite / store", ("sqlite",)),
    ("contextlib (httpx's and httpcore's exception maps)", ("(contextlib.py",)),
    ("worker threads waiting", ("(threading.py",)),
]
ENTRY_POINTS = {
    "provider read (HttpProvider._run)": "_run (server/providers/_http.py",
    "  of which httpx/httpcore read": "aiter_raw (",
    "turn: on_event (emit + reply)": "on_event (server/sessions/turn.py",
    "  of which channel.emit": "emit (server/sessions/channel.py",
    "connection: send_loop": "send_loop (server/web/connection.py",
    "flusher": "server/sessions/flusher.py",
}

# The steps of a turn (``--steps``, for the first-chunk mode): each sample goes to the innermost
# frame that names a step, so a store call inside the accounting counts as the store's.
STEPS: list[tuple[str, tuple[str, ...]]] = [
    ("store: writes and their thread hops", ("SqliteStore.", "PostgresStore.", "(anyio/to_thread.py",
                                             "WorkerThread.run")),
    ("meter: readings + context frames", ("Session.emit_meter", "Session.read_meter", "Meter.read ",
                                          "Meter.frame ")),
    ("trims: ledger, marks, history_trimmed", ("Turn.proactive_trims", "Session.trim ", "Session.keep_trim")),
    ("message in: submit, accepted frame", ("SessionHub.submit", "SessionHub._accept",
                                            "Session.store_soon")),
    ("turn set-up (task, route notices)", ("SessionHub._run_turn", "Turn.run ", "Turn.attempt")),
    ("prepare: history to send", ("Turn.prepare",)),
    ("provider call: request, head, decode", ("HttpProvider._run", "Turn.call ")),
    ("chunks: emit + reply writer", ("Turn.on_event",)),
    ("after the call: accounting", ("Turn.account",)),
    ("reply save, done frame", ("Turn.finish_reply", "Turn.end ", "Turn.done_frame")),
    ("between turns: counts, budget", ("Counts.", "SessionHub.send_budget")),
    ("websocket send loop", ("Connection.send_loop",)),
    ("websocket receive, frame parsing", ("Connection.read_loop", "WebSocketProtocol.data_received")),
]


LOOP, RUN = "run (asyncio/runners.py:118)", "HttpProvider._run (server/providers/_http.py:152)"
SAMPLE = [  # (stack, samples), outermost frame first, as py-spy's raw format has them
    ([LOOP, RUN, "SSEDecoder.feed (server/providers/decoders.py:113)"], 3),
    ([LOOP, RUN, "Response.aiter_raw (httpx/_models.py:990)", "read (h11/_readers.py:100)"], 5),
    ([LOOP, "Connection.send_loop (server/web/connection.py:240)", "send (websockets/protocol.py:300)"], 2),
    ([LOOP], 4),
    ([LOOP, RUN, "FrameLog.append (server/sessions/channel.py:149)", "sys_getsizeof (libpython3.11.so.1.0)",
      "gc_collect_main (libpython3.11.so.1.0)"], 2),
    ([LOOP, RUN, "SSEEvent.json (server/providers/decoders.py:111)", "scanner_call (_json.c:1215)"], 1),
]


def layer_of(stack: list[str]) -> str:
    if any("gc_collect" in frame for frame in stack):  # --native: CPython's cyclic collector
        return "cyclic garbage collector (--native)"
    leaf = stack[-1]
    while is_native(leaf) and len(stack) > 1:  # --native: a C frame counts for the Python one above it
        stack = stack[:-1]
        leaf = stack[-1]
    if "asyncio/runners.py" in leaf or "uvloop" in leaf:  # uvloop's C loop runs under Runner.run
        return "event loop (uvloop: epoll, callbacks, transports)"
    for name, needles in LAYERS:
        if any(needle in leaf for needle in needles):
            return name
    return "other: " + leaf


def step_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, needles in STEPS:
            if any(needle in frame for needle in needles):
                return name
    return "event loop (uvloop), other"


def idle_worker(stack: list[str]) -> bool:
    """An anyio worker thread waiting for work (py-spy samples it as running)."""
    return any("WorkerThread.run" in frame for frame in stack) and "(threading.py" in stack[-1]


def steps(name: str, path: Path) -> str:
    stacks = [(stack, count) for stack, count in read_raw(path) if not idle_worker(stack)
              and not any("_find_and_load" in frame or "build_app" in frame for frame in stack)]
    title = "samples after start-up (idle worker threads left out), by step of a turn"
    return "\n".join(shares(name, title, stacks, step_of)[0])


def shares(name: str, title: str, stacks: list[tuple[list[str], int]],
           key: Callable[[list[str]], str]) -> tuple[list[str], int]:
    """Lines of each ``key``'s share of the samples, most first, under a title; and the total."""
    total = sum(count for _, count in stacks) or 1
    counted: collections.Counter[str] = collections.Counter()
    for stack, count in stacks:
        counted[key(stack)] += count
    lines = [f"\n{name}: {total} {title}"]
    lines += [f"  {share * 100 / total:5.1f} %  {label}" for label, share in counted.most_common()]
    return lines, total


def is_native(frame: str) -> bool:
    """A C frame of a --native profile: "function (libpython3.11.so.1.0)", "function (loop.c:123)"."""
    where = frame.rsplit("(", 1)[-1]
    return ".so" in where or ".c:" in where or ".h:" in where


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def summary(name: str, path: Path) -> str:
    stacks = read_raw(path)
    lines, total = shares(name, "samples (CPU only), by the layer of the innermost frame", stacks, layer_of)
    lines.append("  inclusive:")
    for label, needle in ENTRY_POINTS.items():
        hits = sum(count for stack, count in stacks if any(needle in frame for frame in stack))
        lines.append(f"  {hits * 100 / total:5.1f} %  {label}")
    return "\n".join(lines)


def servers_of(bench: int) -> list[tuple[int, str]]:
    """(pid, path) of the bench's server processes now running: the relay role or meterchat."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        text = [a.decode(errors="replace") for a in argv]
        if parent != bench or not text or "python" not in text[0]:
            continue
        if "--role" in text and text[text.index("--role") + 1] in ("relay", "meterchat"):
            found.append((int(proc.name), text[text.index("--role") + 1]))
        elif "-m" in text and "server" in text:
            found.append((int(proc.name), "meterchat"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/pyspy.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="100")
    parser.add_argument("--seconds", type=float, default=20, help="length of each paced reply")
    parser.add_argument("--paths", default="relay,meterchat")
    parser.add_argument("--record", type=float, default=10, help="seconds of py-spy record per server")
    parser.add_argument("--after", type=float, default=5, help="seconds after a server starts to begin")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (the cyclic "
                        "garbage collector appears only so); pauses the server at each sample")
    parser.add_argument("--out", type=Path, help="where the raw stacks go (default: a temporary dir)")
    parser.add_argument("--summarize", nargs="+", type=Path, help="only summarize these raw files")
    parser.add_argument("--steps", action="store_true", help="also the samples by step of a turn (for "
                        "the first-chunk mode: --steps --sessions '' --first-chunk 1,1,1 --after 1.5)")
    parser.add_argument("--quick", action="store_true", help="summarize a built-in sample (no servers, "
                        "no py-spy): does the summary still work")
    args, extra = parser.parse_known_args()
    if args.quick:
        sample = Path(tempfile.mkdtemp(prefix="meterchat-profile-")) / "sample.txt"
        sample.write_text("".join(f"{';'.join(stack)} {count}\n" for stack, count in SAMPLE))
        print(summary("built-in sample", sample))
        print(steps("built-in sample", sample))
        return
    if args.summarize:
        for raw in args.summarize:
            print(summary(raw.stem, raw))
            if args.steps:
                print(steps(raw.stem, raw))
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="meterchat-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(ROOT / "bench" / "load.py"), "--sessions", args.sessions, "--seconds",
            str(args.seconds), "--paths", args.paths, "--first-chunk", "", *extra]
    if args.pin:
        argv.append("--pin")
    bench = subprocess.Popen(argv, cwd=ROOT)
    seen: dict[int, str] = {}
    recorders: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    while bench.poll() is None:
        for pid, path in servers_of(bench.pid):
            if pid in seen:
                continue
            seen[pid] = path
            time.sleep(args.after)
            raw = out / f"{path}-{pid}.txt"
            recorders.append((path, raw, subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(int(args.record)), "--rate",
                 str(args.rate), "--format", "raw", "--native" if args.native else "--nonblocking",
                 "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(0.2)
    for path, raw, recorder in recorders:
        recorder.wait()
        if raw.exists():
            print(summary(path, raw))
            if args.steps:
                print(steps(path, raw))
    print(f"\nraw stacks: {out}")


if __name__ == "__main__":
    main()
