"""Runs the load bench: starts the parts, drives each phase, samples the server, prints tables."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

from bench.loadkit import cluster, procs, rss
from bench.loadkit.cluster import Served
from bench.loadkit.report import held_within, table

LOAD = str(procs.ROOT / "bench" / "load.py")
CLUSTER = "nginx/"  # the path of N instances behind nginx is named nginx/N
FIRST_CHUNK_TURNS = 200  # turns per concurrency level in the first-chunk mode, shared by the sessions


def play_role(role: str, spec_json: str) -> None:
    """The entry point of a child process."""
    spec: dict[str, Any] = json.loads(spec_json)
    if role == "fake":
        from bench.loadkit.fake import serve as serve_fake
        procs.fast_loop().run_until_complete(serve_fake(spec["port"], spec["seconds"]))
    elif role == "relay":
        from bench.loadkit.relay import serve as serve_relay
        serve_relay(spec["port"], spec["base_url"], spec["options"])
    elif role == "meterchat":
        from bench.loadkit.launch import main as launch
        launch(spec["overrides"], spec["argv"])
    elif role == "clients":
        from bench.loadkit.clients import main as clients
        clients(spec_json)
    else:
        raise SystemExit(f"unknown role {role!r}")


def role_args(role: str, spec: dict[str, Any]) -> list[str]:
    return [LOAD, "--role", role, "--spec", json.dumps(spec)]


def uvicorn_options(args: argparse.Namespace) -> dict[str, str]:
    return {key: value for key in ("loop", "http", "ws") if (value := getattr(args, key))}


def lifted_limits() -> tuple[str, list[str]]:
    """TOML lines lifting connection limits the server offers as settings, and notes on the rest."""
    from server.config.settings import PROVIDER_SCHEMA

    names = [s.name for s in PROVIDER_SCHEMA if "connections" in s.name]
    if not names:
        return "", ["provider pool: no limit setting in this build, httpx's default 100 connections "
                    "(20 kept alive) applies: a wall at 100 concurrent streams"]
    return "".join(f"{name} = 100000\n" for name in names), [f"provider pool: {', '.join(names)} = 100000"]


def meterchat_config(folder: Path, fake: str, live: str = "", data: str = "data",
                     abuse: bool = False, settings: Sequence[str] = ()) -> tuple[Path, list[str]]:
    """The settings file; with ``live`` (a Redis URL) the instances share their live side there.
    The frame rate limit is lifted unless the abuse mix runs (its flood is what the limit is for):
    the first-chunk mode sends a message per 5-token turn, hundreds a second on one socket."""
    limits, notes = lifted_limits()
    path = folder / f"load-{data}.toml"
    rate = "" if abuse else "frame_rate = 100000\nframe_burst = 100000\n"
    rate += "".join(f"{line}\n" for line in settings)  # bench/load.py --setting
    live_section = f'[live]\nurl = "{live}"\n' if live else ""
    path.write_text(f'[server]\ndata_dir = "{(folder / data).as_posix()}"\n{rate}{live_section}'
                    f'[providers.p]\nkind = "openai"\nbase_url = "{fake}/v1"\nmodel = "m"\n'
                    f'context_window = 1000000\ndiscover_window = false\ntools = false\n'
                    f'timeout_seconds = 300\n{limits}')
    return path, notes


class Bench:
    """One run: the fake provider for its whole length, servers started fresh per phase."""

    def __init__(self, args: argparse.Namespace, folder: Path, stack: ExitStack) -> None:
        self.args = args
        self.server_cores, self.load_cores = ("0", "1") if args.pin else (None, None)
        self.folder, self.log = folder, folder / "children.log"
        port = procs.free_port()
        self.fake = f"http://127.0.0.1:{port}"
        # Two hours outlasts any run; the fake also dies with the bench (procs.spawn).
        fake = procs.start(role_args("fake", {"port": port, "seconds": 2 * 3600}), port,
                           self.load_cores, self.log)
        stack.callback(procs.stop, fake)
        self.config, self.notes = meterchat_config(folder, self.fake, abuse=args.abuse,
                                                   settings=args.setting)

    def serve(self, path: str, stack: ExitStack) -> Served:
        """Start the server of ``path`` (nothing for direct)."""
        if path == "direct":
            return Served(self.fake.removeprefix("http://"))
        if path.startswith(CLUSTER):
            return cluster.start_cluster(int(path.removeprefix(CLUSTER)), self.folder, self.live_config,
                                         stack, self.server_cores, self.log)
        port = procs.free_port()
        served = Served(f"127.0.0.1:{port}")
        if path == "relay":
            args = role_args("relay", {"port": port, "base_url": self.fake + "/v1",
                                       "options": uvicorn_options(self.args)})
        else:
            args = self.meterchat_args(port, served, stack)
        process = procs.start(args, port, self.server_cores, self.log)
        stack.callback(procs.stop, process)
        served.pids = (process.pid,)
        return served

    def live_config(self, redis_url: str, data_dir: Path) -> Path:
        return meterchat_config(self.folder, self.fake, redis_url, data_dir.name, self.args.abuse,
                               self.args.setting)[0]

    def meterchat_args(self, port: int, served: Served, stack: ExitStack) -> list[str]:
        workers = self.workers_flag() if self.args.workers else []
        config = self.config
        if workers and self.args.workers > 1:  # workers share the live side as instances do: Redis
            served.redis_port, served.side["redis"] = cluster.start_redis(self.folder, stack,
                                                                          self.server_cores, self.log)
            config = self.live_config(f"redis://127.0.0.1:{served.redis_port}/0",
                                      self.folder / f"data-{served.redis_port}")
        argv = ["--config", str(config), "--port", str(port), "--log-level", "warning", *workers]
        if options := uvicorn_options(self.args):
            return role_args("meterchat", {"overrides": options, "argv": argv})
        return ["-m", "server", *argv]

    def workers_flag(self) -> list[str]:
        usage = subprocess.run(procs.command(["-m", "server", "--help"], None), cwd=procs.ROOT,
                               capture_output=True, text=True, timeout=60).stdout
        if "--workers" in usage:
            return ["--workers", str(self.args.workers)]
        self.notes.append("--workers ignored: meterchat's CLI has no --workers in this build")
        return []

    def clients(self, plan: dict[str, Any], pid: tuple[int, ...] | None) -> dict[str, Any]:
        """Run one client process against a path, sampling the server while it runs."""
        cpu0 = procs.cpu_seconds(pid) if pid else 0.0
        calls0 = procs.rw_syscalls(pid) if pid else 0
        rss0 = peak = procs.rss_bytes(pid) if pid else 0
        samples = [rss0]
        started = time.monotonic()
        with self.log.open("ab") as sink:
            child = procs.spawn(role_args("clients", plan), self.load_cores, stdout=subprocess.PIPE,
                                stderr=sink)
        try:
            while child.poll() is None and time.monotonic() - started < plan["timeout"] + 30:
                samples.append(procs.rss_bytes(pid) if pid else 0)
                peak = max(peak, samples[-1])
                time.sleep(rss.SAMPLE)
        finally:
            procs.stop(child)
        wall = time.monotonic() - started
        with child.stdout or open(os.devnull, "rb") as out:
            result: dict[str, Any] = json.loads(out.read() or b"{}")
        cpu = procs.cpu_seconds(pid) - cpu0 if pid else None
        result.update(sessions=plan["sessions"], rate=plan["rate"],
                      client_pct=100 * result["client_cpu"] / wall)
        if cpu is not None:
            result.update(cpu_per_1k=1000 * cpu / max(1, result["received"]), core_pct=100 * cpu / wall,
                          syscalls_per_chunk=(procs.rw_syscalls(pid) - calls0) / max(1, result["received"]),
                          rss_per_session=(peak - rss0) / plan["sessions"] / 1024,
                          rss_mib=[round(rss0 / 2**20), round(peak / 2**20), round(samples[-1] / 2**20)],
                          rss_series=rss.series(samples), rss_base=rss0)
        return result

    def measure(self, paths: list[str], plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each path in turn, its server started fresh (so RSS growth is this phase's alone)."""
        results = {}
        for path in paths:
            with ExitStack() as stack:
                results[path] = self.measure_path(path, plan, stack)
        return results

    def measure_path(self, path: str, plan: dict[str, Any], stack: ExitStack) -> dict[str, Any]:
        served = self.serve(path, stack)
        kind = "direct" if path == "direct" else "ws"
        warm = {**plan, "kind": kind, "host": served.host, "sessions": max(1, len(served.pids)),
                "turns": 1, "tokens": 5, "rate": 0, "ramp": 0.0, "timeout": 30.0}
        pids = served.pids or None
        self.clients(warm, pids)  # imports, first connections and lazy set-up are not measured
        abuse = bool(plan.get("abuse")) and path == "meterchat"  # the relay speaks too little protocol
        cpu0 = cluster.side_cpu(served)
        counters0 = cluster.redis_counters(served.redis_port) if served.redis_port else None
        cores = ("cpu0", "cpu1", "cpu") if self.args.pin else ("cpu",)  # pinned: server, load, all
        stolen0 = [stolen(core) for core in cores]
        result = self.clients({**plan, "kind": kind, "host": served.host, "abuse": abuse}, pids)
        result["steal"] = {core: stolen(core).since(before)
                           for core, before in zip(cores, stolen0, strict=True)}
        if served.side:
            result.update(cluster.side_figures(served, cpu0, counters0, result["received"]))
        if path == "meterchat" and "rss_base" in result:  # the warm-up's session stays in memory too
            sockets = plan["sessions"] + 3 * abuse
            result["rss_bound"] = rss.bound(result["rss_base"], sockets + 1, sockets)
        return result


def paced_plan(args: argparse.Namespace, sessions: int) -> dict[str, Any]:
    tokens = int(args.seconds * args.rate)
    return {"sessions": sessions, "turns": 1, "tokens": tokens, "rate": args.rate, "ramp": args.ramp,
            "timeout": args.ramp + args.seconds * 3 + 60, "abuse": args.abuse}


def first_chunk_plan(concurrency: int, quick: bool) -> dict[str, Any]:
    turns = max(3, (FIRST_CHUNK_TURNS // 8 if quick else FIRST_CHUNK_TURNS) // concurrency)
    return {"sessions": concurrency, "turns": turns, "tokens": 5, "rate": 0, "ramp": 0.0, "timeout": 120.0}


def numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> None:
    procs.raise_file_limit()
    # A terminated bench still runs its clean-up (the children also die with it, see procs.spawn).
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        measure_all(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def measure_all(args: argparse.Namespace) -> None:
    if args.pin:
        os.sched_setaffinity(0, {1})
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    paths += [f"{CLUSTER}{count}" for count in numbers(args.instances)]
    with tempfile.TemporaryDirectory(prefix="meterchat-load-") as tmp, ExitStack() as stack:
        bench = Bench(args, Path(tmp), stack)
        print(header(args, bench.notes), flush=True)
        by_n: dict[int, dict[str, dict[str, Any]]] = {}
        for n in numbers(args.sessions):
            load = loadavg()
            results = by_n[n] = bench.measure(paths, paced_plan(args, n))
            print(table(f"\n{n} sessions x {args.rate} tokens/s, {args.seconds:g} s replies "
                        f"(machine load average {load} -> {loadavg()})", results), flush=True)
        if len(by_n) > 1 and (held := held_within(by_n, args.within)):
            print(held, flush=True)
        for concurrency in numbers(args.first_chunk):
            plan = first_chunk_plan(concurrency, args.quick)
            load = loadavg()
            results = bench.measure(paths, plan)
            print(table(f"\nfirst chunk, concurrency {concurrency}, {plan['turns']} turns each "
                        f"(5-token replies at full speed; load average {load} -> {loadavg()})", results),
                  flush=True)
        if args.keep_logs:
            print(Path(tmp, "children.log").read_text()[-4000:])


def cluster_notes(args: argparse.Namespace) -> list[str]:
    if not numbers(args.instances):
        return []
    notes = [f"{CLUSTER}N = N meterchat processes behind nginx (deploy/nginx.conf), sharing a private "
             "redis-server ([live] url) and one SQLite file; the server's CPU and RSS are the N "
             "processes' sum, nginx's and Redis's CPU are printed apart"]
    if args.pin:
        notes.append("pinned: every instance, nginx and Redis share core 0 (the cost of the extra hops, "
                     "not the scaling)")
    return notes


class Ticks(NamedTuple):
    steal: int
    total: int

    def since(self, before: Ticks) -> float | None:
        """The share of the machine's CPU time the host took for other guests meanwhile, in %."""
        total = self.total - before.total
        return 100 * (self.steal - before.steal) / total if total > 0 else None


def stolen(core: str = "cpu") -> Ticks:
    """/proc/stat's steal and total ticks of ``core`` (``cpu``: all of them): a virtual machine's
    noise, which delays every path alike (the hour the VM runs in moves the p99 by tens of ms). No
    such line (no /proc, no such core): no ticks, so no share is printed."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return Ticks(0, 0)
    line = next((line for line in lines if line.split(maxsplit=1)[:1] == [core]), "")
    fields = [int(v) for v in line.split()[1:]]
    total = sum(fields[:8])  # guest time is counted in user time already
    return Ticks(fields[7] if len(fields) > 7 else 0, total)


def loadavg() -> str:
    """The machine's one-minute load average: how much else competed for the cores meanwhile."""
    return Path("/proc/loadavg").read_text().split()[0]


def header(args: argparse.Namespace, notes: list[str]) -> str:
    pinned = "server on core 0, fake + clients on core 1" if args.pin else "no"
    lines = [f"load bench: {os.cpu_count()} cores, pinned: {pinned}; "
             f"uvicorn options: {uvicorn_options(args) or 'as server/cli.py sets them'}",
             "columns: delays in ms; + = added over direct; cpu s/1k = server CPU seconds per 1,000 "
             "chunks; core % = server CPU share of one core; rss/sess = server RSS growth per session",
             "rw sys/chunk = the server's read and write system calls (/proc/PID/io syscr + syscw; "
             "epoll not counted) per chunk delivered",
             "ok = sessions held (their reply finished); redis rt/chunk = Redis round trips (requests "
             "read) per chunk delivered",
             *cluster_notes(args),
             *notes]
    return "\n".join(lines)
