"""Several meterchat instances behind nginx (``--instances``), and the private Redis they share.

``start_redis`` runs a redis-server on a free port (no persistence, its folder in the bench's temp
folder); ``start_cluster`` runs N ``python -m server`` processes with ``[live] url`` on it and one
SQLite file between them, and nginx in front from deploy/nginx.conf (bench/loadkit/nginx.py). The
same Redis serves ``--workers N``. ``Served`` says what was started: the address the clients use,
the meterchat processes (their CPU and RSS are the server's), the side processes (nginx, Redis:
their CPU reported apart) and the Redis port whose counters give the round trips per chunk.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadkit import nginx, procs

REDIS_HINT = ("redis-server is not installed: --instances and --workers N need Debian's redis-server "
              "(scripts/test installs it; or: apt-get install redis-server)")
COUNTERS = ("total_commands_processed", "total_reads_processed")


@dataclass
class Served:
    host: str
    pids: tuple[int, ...] = ()
    side: dict[str, int] = field(default_factory=dict)
    redis_port: int | None = None


def start_redis(folder: Path, stack: ExitStack, cores: str | None, log: Path) -> tuple[int, int]:
    """A private redis-server; returns its port and pid."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(REDIS_HINT)
    port = procs.free_port()
    directory = folder / f"redis-{port}"
    directory.mkdir()
    program = procs.pinned([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", str(directory)], cores)
    process = procs.start_program(program, port, log)
    stack.callback(procs.stop, process)
    return port, process.pid


def redis_counters(port: int) -> dict[str, int]:
    """The totals of ``INFO stats`` and each command's calls (``cmdstat_<name>``) from ``INFO
    commandstats``, read with one raw request (which adds one command and one read to the totals)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, raw.makefile("rb") as reply:
        raw.sendall(b"INFO all\r\n")
        size = int(reply.readline()[1:])  # a bulk string: $<length>, the text, CRLF
        text = reply.read(size + 2).decode()
    counters: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in COUNTERS:
            counters[name] = int(value)
        elif name.startswith("cmdstat_"):
            counters[name] = int(value.split(",", 1)[0].removeprefix("calls="))
    return counters


def per_chunk(before: dict[str, int], after: dict[str, int], chunks: int) -> dict[str, Any]:
    """Redis commands and round trips (requests read) per chunk delivered, less the INFO itself,
    and the commands most called, per chunk."""
    def delta(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    calls = {name.removeprefix("cmdstat_"): delta(name) / max(1, chunks)
             for name in after if name.startswith("cmdstat_") and name != "cmdstat_info" and delta(name)}
    return {"redis_commands_per_chunk": (delta(COUNTERS[0]) - 1) / max(1, chunks),
            "redis_reads_per_chunk": (delta(COUNTERS[1]) - 1) / max(1, chunks),
            "redis_calls_per_chunk": dict(sorted(calls.items(), key=lambda item: -item[1])[:6])}


def start_cluster(count: int, folder: Path, config: Callable[[str, Path], Path], stack: ExitStack,
                  cores: str | None, log: Path) -> Served:
    """``count`` instances on one Redis and one SQLite file, nginx in front; ``config(redis_url,
    data_dir)`` writes the instances' settings file."""
    redis_port, redis_pid = start_redis(folder, stack, cores, log)
    settings = config(f"redis://127.0.0.1:{redis_port}/0", folder / f"data-{redis_port}")
    ports, pids = [], []
    for _ in range(count):
        port = procs.free_port()
        process = procs.start(["-m", "server", "--config", str(settings), "--port", str(port),
                               "--log-level", "warning"], port, cores, log)
        stack.callback(procs.stop, process)
        ports.append(port)
        pids.append(process.pid)
    proxy_port, proxy_pid = start_nginx([f"127.0.0.1:{port}" for port in ports], stack, cores, log)
    return Served(f"127.0.0.1:{proxy_port}", tuple(pids), {"nginx": proxy_pid, "redis": redis_pid},
                  redis_port)


def start_nginx(upstreams: list[str], stack: ExitStack, cores: str | None, log: Path) -> tuple[int, int]:
    folder = nginx.make_folder()
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    port = procs.free_port()
    program = procs.pinned(nginx.command(folder, nginx.write_config(folder, upstreams, port)), cores)
    process = procs.start_program(program, port, log)
    stack.callback(procs.stop, process)
    return port, process.pid


def side_cpu(served: Served) -> dict[str, float]:
    return {name: procs.cpu_seconds(pid) for name, pid in served.side.items()}


def side_figures(served: Served, cpu0: dict[str, float], counters0: dict[str, int] | None,
                 chunks: int) -> dict[str, Any]:
    """What the side processes cost over one measured run: CPU seconds per 1,000 chunks each, and
    Redis's commands and round trips per chunk."""
    figures: dict[str, Any] = {"side_cpu_per_1k": {
        name: 1000 * (seconds - cpu0[name]) / max(1, chunks) for name, seconds in side_cpu(served).items()}}
    if served.redis_port is not None and counters0 is not None:
        figures.update(per_chunk(counters0, redis_counters(served.redis_port), chunks))
    return figures
