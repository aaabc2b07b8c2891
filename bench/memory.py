"""Memory a live session holds as it streams, measured as RSS: ``python bench/memory.py [--quick]``.

Builds sessions in this process and streams chunk frames through ``Session.emit`` (numbering,
serializing, the resume log) until each session's log is at its bound (``FRAME_LOG_BYTES``), then
reads the process's resident memory (/proc/self/statm) before and after. Prints the RSS per session
and per logged chunk against what the log says it holds (``FrameLog.bytes``, the figure the bound is
enforced on): a ratio near 1.0 means the bound is true. Printed, never asserted. ``--quick`` runs
2 sessions with a 256 KiB log (about a second), to check the bench still runs.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.routing.resolver import Route  # noqa: E402
from server.sessions.channel import FRAME_LOG_BYTES, FrameChannel  # noqa: E402
from server.sessions.events import EventBus  # noqa: E402
from server.sessions.session import Session  # noqa: E402

PIECES = ("token ", "the ", "of ", "and ", "meterchat ", "\n", "streams ", "a ")  # typical deltas


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def stream_to_cap(live: Session, chunks: int) -> None:
    turn_id = os.urandom(6).hex()  # the 12 hex digits a turn id has
    for n in range(chunks):
        live.emit({"type": "chunk", "turn_id": turn_id, "content": PIECES[n % len(PIECES)]})


def measure(sessions: int, log_bytes: int) -> tuple[int, int, int]:
    """RSS grown, bytes the logs say they hold, chunks logged (over all sessions)."""
    chunks = log_bytes // 60 * 2  # enough to fill the log and keep dropping its oldest
    lives = []
    gc.collect()
    before = rss_bytes()
    for n in range(sessions):
        channel = FrameChannel(f"s{n}", EventBus())
        channel.log.limit_bytes = log_bytes
        live = Session(f"s{n}", "bench", Route("demo", "demo-small", "default"), [], channel=channel)
        stream_to_cap(live, chunks)
        lives.append(live)
    gc.collect()
    grown = rss_bytes() - before
    return grown, sum(live.channel.log.bytes for live in lives), sum(len(live.channel.log) for live in lives)


def main(quick: bool = False) -> None:
    sessions, log_bytes = (2, 256 * 1024) if quick else (40, FRAME_LOG_BYTES)
    grown, held, logged = measure(sessions, log_bytes)
    print(f"{sessions} sessions, each streamed past its log bound of {log_bytes / 2**20:.2f} MiB")
    print(f"RSS per session:        {grown / sessions / 2**20:8.2f} MiB")
    print(f"log bytes per session:  {held / sessions / 2**20:8.2f} MiB (what the bound is enforced on)")
    print(f"RSS per logged chunk:   {grown / logged:8.1f} B   counted per chunk: {held / logged:6.1f} B")
    print(f"RSS / counted:          {grown / held:8.2f}x")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
