"""Process plumbing for the load bench: start a part in its own process (optionally pinned to a
core), wait until it answers, read its CPU time and RSS from /proc, and always stop it."""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")


def fast_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (the fake and the clients should cost as little as they can)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def raise_file_limit() -> None:
    """A thousand sessions need thousands of sockets per process; children inherit the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(args: list[str], cores: str | None) -> list[str]:
    return pinned([sys.executable, *args], cores)


def pinned(program: list[str], cores: str | None) -> list[str]:
    prefix = ["taskset", "-c", cores] if cores and shutil.which("taskset") else []
    return [*prefix, *program]


def die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGTERM when the bench dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def spawn(args: list[str], cores: str | None, **options: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command(args, cores), cwd=ROOT, preexec_fn=die_with_parent, **options)


def start(args: list[str], port: int, cores: str | None, log: Path) -> subprocess.Popen[bytes]:
    """Start a Python part (``args`` after the interpreter) and wait until it accepts on ``port``."""
    return start_program(command(args, cores), port, log)


def start_program(program: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """Start any program and wait (at most 30 s) until it accepts connections on ``port``."""
    with log.open("ab") as sink:
        process = subprocess.Popen(program, cwd=ROOT, preexec_fn=die_with_parent, stdout=sink, stderr=sink)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.05)
    stop(process)
    raise RuntimeError(f"{' '.join(program[:4])} did not start; see {log}:\n{log.read_text()[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def tree(pid: int | tuple[int, ...]) -> list[int]:
    """``pid`` (or each of several) and their descendants (workers count toward the server)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid] if isinstance(pid, int) else list(pid)
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int | tuple[int, ...]) -> float:
    total = 0.0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return total


def rw_syscalls(pid: int | tuple[int, ...]) -> int:
    """Read and write system calls so far (``syscr`` + ``syscw`` of /proc/PID/io: read, recv,
    write, send and their kin; epoll is not counted), over the process tree."""
    total = 0
    for member in tree(pid):
        try:
            fields = dict(line.split(": ") for line in Path(f"/proc/{member}/io").read_text().splitlines())
        except (OSError, ValueError):
            continue
        total += int(fields.get("syscr", 0)) + int(fields.get("syscw", 0))
    return total


def rss_bytes(pid: int | tuple[int, ...]) -> int:
    total = 0
    for member in tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
