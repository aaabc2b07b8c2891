"""Memory a live session holds as it streams: ``python bench/memory.py [--quick]``.

Streams replies of 400 chunks through ``Session.emit`` (the frame log for resume) and keeps the
transcript and ledger as a session does, for 10, 100 and 1,000 turns. Prints the Python heap the
session holds (tracemalloc) against the baseline measured in the same run: the bytes of text the
turns contain. The frame log is bounded by ``FRAME_LOG_BYTES``, so the held memory should grow with
the transcript (the text itself), not with every frame ever sent. Printed, never asserted.
``--quick`` streams 2 and 10 turns (about a second), to check the bench still runs.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.channel import FRAME_LOG_BYTES, FrameChannel  # noqa: E402
from server.events import EventBus  # noqa: E402
from server.history import TRIMMED, ChatMessage  # noqa: E402
from server.routing import Route  # noqa: E402
from server.session import Session  # noqa: E402

CHUNKS = 400
PIECE = "token "


def stream_turns(live: Session, turns: int) -> int:
    text_bytes = 0
    for n in range(turns):
        turn_id = f"t{n}"
        user = ChatMessage("user", f"question {n} " + "words " * 40, turn_id=turn_id)
        live.add(user)
        parts = []
        for _ in range(CHUNKS):
            parts.append(PIECE)
            live.emit({"type": "chunk", "turn_id": turn_id, "content": PIECE})
        reply = ChatMessage("assistant", "".join(parts), turn_id=turn_id)
        live.add(reply)
        for message in live.ledger.trim_turn_count(50).dropped:
            message.left_out = TRIMMED
        text_bytes += len(user.content) + len(reply.content)
    return text_bytes


def measure(turns: int) -> tuple[int, int, int]:
    gc.collect()
    tracemalloc.start()
    live = Session("bench", "bench", Route("demo", "demo-small", "default"), [],
                   channel=FrameChannel("bench", EventBus()))
    text = stream_turns(live, turns)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, text, live.channel.log.bytes


def main(quick: bool = False) -> None:
    print(f"{CHUNKS} chunks per reply; frame log bound {FRAME_LOG_BYTES / 2**20:.0f} MiB (estimated bytes)")
    print(f"{'turns':>6} {'frames sent':>12} {'text (baseline)':>16} {'held':>12} {'held / text':>12}"
          f" {'log bytes':>12}")
    for turns in (2, 10) if quick else (10, 100, 1000):
        held, text, log_bytes = measure(turns)
        print(f"{turns:>6} {turns * CHUNKS:>12,} {text:>16,} {held:>12,} {held / text:>12.1f}"
              f" {log_bytes:>12,}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
