"""The server's RSS over a phase (issue 9: "RSS over time"; "RSS stays within a stated bound").

``series`` thins the 0.25 s samples the runner takes to one every ``STEP`` seconds, in MiB. ``bound``
states what meterchat's settings let it hold beyond its resting size: each session in memory keeps a
resume log of at most ``FRAME_LOG_BYTES`` and each socket an outbox of at most ``max_outbox_bytes``
(counted in wire bytes; the texts are shared with the log, so this over-counts). What a session
holds beside those (its transcript and the reply being written, a few objects per socket) is not
bounded by a setting and is why the check is printed, not asserted.
"""

from __future__ import annotations

from typing import Any

STEP = 2.0  # seconds between printed samples
SAMPLE = 0.25  # seconds between the runner's samples
MIB = 1 << 20


def series(samples: list[int], every: float = STEP, sampled: float = SAMPLE) -> list[int]:
    """One sample in MiB per ``every`` seconds, the last sample always included."""
    stride = max(1, round(every / sampled))
    picked = samples[::stride]
    if samples and (len(samples) - 1) % stride:
        picked.append(samples[-1])
    return [round(value / MIB) for value in picked]


def bound(base: int, sessions: int, connections: int) -> dict[str, Any]:
    """The bound for ``sessions`` in memory and ``connections`` open, from the server's defaults
    (the load bench's configuration leaves both settings as they are)."""
    from server.config.settings import ServerSettings
    from server.sessions.channel import FRAME_LOG_BYTES

    outbox = ServerSettings().max_outbox_bytes
    total = base + sessions * FRAME_LOG_BYTES + connections * outbox
    return {"base_mib": round(base / MIB), "sessions": sessions, "log_mib": FRAME_LOG_BYTES / MIB,
            "connections": connections, "outbox_mib": outbox / MIB, "mib": round(total / MIB)}


def describe(name: str, r: dict[str, Any]) -> list[str]:
    """The report's RSS lines for one path."""
    before, peak, end = r["rss_mib"]
    lines = [f"  {name} RSS: {before} MiB before, {peak} MiB at peak, {end} MiB at the end"]
    if r.get("rss_series"):
        lines.append(f"  {name} RSS every {STEP:g} s, MiB: {' '.join(map(str, r['rss_series']))}")
    if b := r.get("rss_bound"):
        verdict = "within" if peak <= b["mib"] else "OVER"
        lines.append(f"  {name} RSS bound: {b['base_mib']} MiB before + {b['sessions']} sessions x "
                     f"{b['log_mib']:g} MiB resume log + {b['connections']} sockets x {b['outbox_mib']:g} "
                     f"MiB outbox = {b['mib']} MiB; peak {peak} MiB is {verdict} it "
                     f"({100 * (peak - before) / max(1, b['mib'] - before):.1f}% of the allowance used)")
    return lines
