"""The load bench's tables: one row per path (direct, bare relay, meterchat), deltas against
reading the provider directly, ratios against the bare relay."""

from __future__ import annotations

from typing import Any

from bench.loadkit import rss

COLUMNS = ("path", "ok", "chunks", "lost", "reord", "p50 ms", "p99 ms", "+p50", "+p99", "1st +p50",
           "1st +p99", "cpu s/1k", "rw sys/chunk", "1-core cap", "core %", "rss/sess KiB",
           "client %", "redis rt/chunk")


def cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def row(name: str, r: dict[str, Any], direct: dict[str, Any]) -> list[str]:
    delay, first = r["delay"] or {}, r["first"] or {}
    base, base_first = direct["delay"] or {}, direct["first"] or {}

    def added(now: dict[str, float], floor: dict[str, float], key: str) -> float | None:
        return now[key] - floor[key] if key in now and key in floor and name != "direct" else None

    return [name, f"{r['finished']}/{r['sessions']}", str(r["received"]), str(r["lost"]),
            str(r["reordered"]), cell(delay.get("p50")), cell(delay.get("p99")),
            cell(added(delay, base, "p50")), cell(added(delay, base, "p99")),
            cell(added(first, base_first, "p50")), cell(added(first, base_first, "p99")),
            cell(r.get("cpu_per_1k"), 3), cell(r.get("syscalls_per_chunk"), 2), cell(ceiling(r), 0),
            cell(r.get("core_pct"), 0),
            cell(r.get("rss_per_session"), 0), cell(r.get("client_pct"), 0),
            cell(r.get("redis_reads_per_chunk"), 3)]


def ceiling(r: dict[str, Any]) -> float | None:
    """Sessions one core could carry at this rate if CPU were the only limit: the figure that other
    load on the machine disturbs least (CPU time, unlike delay, does not grow while waiting)."""
    cpu, rate = r.get("cpu_per_1k"), r.get("rate")
    return 1000 / (cpu * rate) if cpu and rate else None


def table(title: str, results: dict[str, dict[str, Any]]) -> str:
    direct = results.get("direct") or {"delay": {}, "first": {}}
    rows = [list(COLUMNS)] + [row(name, r, direct) for name, r in results.items()]
    widths = [max(len(line[i]) for line in rows) for i in range(len(COLUMNS))]
    lines = [title] + ["  ".join(text.rjust(w) for text, w in zip(line, widths, strict=True))
                       for line in rows]
    lines += ratios(results, direct)
    for name, r in results.items():
        if r.get("ready"):
            lines.append(f"  {name} connect to session frame p50 / p99 / max ms: "
                         f"{r['ready']['p50']:.0f} / {r['ready']['p99']:.0f} / {r['ready']['max']:.0f}; "
                         f"streams at once, at most: {r['peak']}")
        if r.get("by_second"):
            lines.append(f"  {name} p99 ms by second of the run (received): "
                         + " ".join(f"{p99:.0f}" for p99 in r["by_second"])
                         + steal(r.get("steal") or {}))
        if r.get("rss_mib"):
            lines += rss.describe(name, r)
        if r.get("side_cpu_per_1k"):
            lines.append(f"  {name} beside it: {side(r)}")
        if r["errors"]:
            lines.append(f"  {name} errors: {r['errors']}")
            lines += [f"    {code}: {message}" for code, message in (r.get("said") or {}).items()]
        for kind, outcome in (r.get("abuse") or {}).items():
            lines.append(f"  {name} abuse {kind}: {outcome}")
    return "\n".join(lines)


def steal(shares: dict[str, float | None]) -> str:
    """The host's steal during the path: "; host steal 0.4 % (cpu0), 1.2 % (cpu1), 0.8 % (cpu)"."""
    parts = [f"{share:.1f} % ({core})" for core, share in shares.items() if share is not None]
    return f"; host steal {', '.join(parts)}" if parts else ""


def side(r: dict[str, Any]) -> str:
    """nginx's and Redis's share: CPU per 1,000 chunks, and Redis commands per chunk."""
    parts = [f"{name} {seconds:.3f} cpu s/1k" for name, seconds in r["side_cpu_per_1k"].items()]
    if r.get("redis_commands_per_chunk") is not None:
        calls = ", ".join(f"{name} {n:.2f}" for name, n in r["redis_calls_per_chunk"].items())
        parts.append(f"Redis {r['redis_commands_per_chunk']:.2f} commands/chunk ({calls})")
    return "; ".join(parts)


def ratios(results: dict[str, dict[str, Any]], direct: dict[str, Any]) -> list[str]:
    relay, served = results.get("relay"), results.get("meterchat")
    if not relay or not served:
        return []
    out = []
    for label, key, sub in (("added p50", "delay", "p50"), ("added p99", "delay", "p99"),
                            ("first-chunk added p50", "first", "p50")):
        try:
            floor = direct[key][sub]
            a, b = served[key][sub] - floor, relay[key][sub] - floor
        except KeyError:
            continue
        out.append(f"  meterchat / bare relay, {label}: {a:.2f} / {b:.2f} ms = {ratio(a, b)}")
    for label, key in (("CPU per 1k chunks", "cpu_per_1k"), ("RSS per session", "rss_per_session")):
        if served.get(key) is not None and relay.get(key):
            out.append(f"  meterchat / bare relay, {label}: {ratio(served[key], relay[key])}")
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a (relay adds nothing measurable)"


def held_within(by_n: dict[int, dict[str, dict[str, Any]]], bound_ms: float) -> str:
    """After several N: the most streams each path held with every reply finished and its added p99
    at most ``bound_ms``, at that N and every smaller one tried (a noisy pass above a failure does
    not count): with a pinned server, the most streams per core at that p99. Then meterchat's figure
    against the relay's. Empty when some N has no direct path to add the delay over."""
    if any("direct" not in results for results in by_n.values()):
        return ""
    held: dict[str, int | None] = {}
    failed: set[str] = set()
    for n, results in sorted(by_n.items()):
        floor = (results["direct"].get("delay") or {}).get("p99", 0.0)
        for name, r in results.items():
            if name == "direct":
                continue
            held.setdefault(name, None)
            added = (r["delay"] or {}).get("p99", float("inf")) - floor
            if r["finished"] != r["sessions"] or added > bound_ms:
                failed.add(name)
            elif name not in failed:
                held[name] = n
    sizes = ", ".join(str(n) for n in sorted(by_n))
    parts = [f"{name} {count if count else 'none'}" for name, count in held.items()]
    line = f"\nstreams held with +p99 <= {bound_ms:g} ms, of N = {sizes}: " + "; ".join(parts)
    relay, served = held.get("relay"), held.get("meterchat")
    if relay and served:
        line += f"; meterchat / bare relay: {served / relay:.2f}x"
    elif served and "relay" in held:
        line += f"; meterchat / bare relay: more than {served / min(by_n):.2f}x (the relay held no N tried)"
    return line
