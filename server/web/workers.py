"""``meterchat --workers N``: one listening socket, N worker processes, sessions shared through Redis.

The parent binds the socket once (so the port, and the exposure refusal before it, are decided
once), then runs N children, each a whole server (``python -m server`` with the socket's descriptor:
``DrainingServer``, the guarded HTTP protocol, ``RedactLogs``) accepting on that one socket; the
kernel hands each new connection to one of them. A reconnect or a second tab may therefore reach any
worker, so the workers share the live side through ``[live] url`` (Redis live mode): any worker
resumes, stops or switches any session, and the turn lease keeps one turn on one worker.

The parent only supervises. A worker that dies is started again (a log line); its turns are taken
over through the lease like a dead instance's (``instance_lost``). SIGTERM or SIGINT to the parent
becomes SIGTERM to every worker: each drains (streaming replies stored, sockets closed 1012), and the
parent waits ``shutdown_grace_seconds`` plus ``STOP_MARGIN`` before it kills what is left.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from server.config.settings import Settings
from server.web.serving import DrainingServer

log = logging.getLogger(__name__)

WORKER_HEADER = "x-meterchat-worker"  # on every response of a worker: which one served it
STOP_MARGIN = 5.0  # seconds past the grace for uvicorn to close sockets and the process to exit
REFUSED = (2, 3)  # a worker's start-up refusal (meterchat's ConfigError, uvicorn's STARTUP_FAILURE)
BACKLOG = 2048  # uvicorn's default
CRASH_WINDOW, CRASH_LIMIT = 10.0, 2  # more than 2 deaths per worker in 10 s: give up, do not spin


def worker_count(text: str) -> int:
    """``--workers``: a positive number, or ``auto`` / ``0`` for one per core."""
    if text.strip().lower() in ("auto", "0"):
        return os.cpu_count() or 1
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError("expected a number >= 0 or 'auto'")
    return count


def workers_problem(settings: Settings, count: int) -> str | None:
    """Why ``count`` workers cannot share sessions with these settings, in one line, or None."""
    if count > 1 and not settings.live.url:
        return (f"--workers {count} needs [live] url (or METERCHAT_LIVE_URL): the workers share "
                "sessions through Redis, so a reconnect may reach any of them (docs/deployment.md)")
    return None


def listen(host: str, port: int) -> socket.socket:
    """The one listening socket every worker accepts on (uvicorn's ``Config.bind_socket``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"meterchat: cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Keeps ``count`` workers running until SIGTERM or SIGINT, then stops them within the grace.

    ``command(index)`` is the argv of worker ``index``; it inherits ``fd`` (the listening socket).
    Signals only put their number in a queue (``SimpleQueue.put`` is safe in a signal handler); the
    loop waits on it, so a dead worker is replaced as soon as its SIGCHLD arrives."""

    def __init__(self, command: Callable[[int], list[str]], count: int, fd: int, grace: float) -> None:
        self.command = command
        self.count = count
        self.fd = fd
        self.grace = grace
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.exit_code: int | None = None
        self.deaths: list[float] = []  # when workers died, within the last CRASH_WINDOW

    def run(self) -> int:
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        previous = {sig: signal.signal(sig, lambda signum, _frame: self.signals.put(signum))
                    for sig in handled}
        try:
            for index in range(1, self.count + 1):
                self.start(index)
            while self.exit_code is None:
                self.wait(None)
                self.replace_dead()
            self.stop_all()
            return self.exit_code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def start(self, index: int) -> None:
        process = subprocess.Popen(self.command(index), pass_fds=(self.fd,))
        self.workers[index] = process
        log.info("worker %d started (pid %d)", index, process.pid)

    def wait(self, timeout: float | None) -> None:
        """Until a signal arrives; a second's timeout guards against a SIGCHLD that came before the
        handler was set (a worker dying while the next starts)."""
        try:
            got = [self.signals.get(timeout=1.0 if timeout is None else min(timeout, 1.0))]
        except queue.Empty:
            return
        while not self.signals.empty():  # all that came, so a stop is seen before a death
            got.append(self.signals.get_nowait())
        stops = [signum for signum in got if signum in (signal.SIGTERM, signal.SIGINT)]
        if stops and self.exit_code is None:
            log.info("%s: stopping %d workers", signal.Signals(stops[0]).name, len(self.workers))
            self.exit_code = 0

    def replace_dead(self) -> None:
        for index, process in list(self.workers.items()):
            code = process.poll()
            if code is None or self.exit_code is not None:
                continue
            if code in REFUSED:  # it would refuse again: a setting or a dependency is wrong
                log.error("worker %d refused to start (exit %d): stopping", index, code)
                self.exit_code = code
                return
            if self.crashing():  # a crash at start-up would otherwise loop forever
                log.error("worker %d (pid %d) %s; workers keep dying (%d in %g s): stopping", index,
                          process.pid, ended(code), len(self.deaths), CRASH_WINDOW)
                self.exit_code = 1
                return
            log.warning("worker %d (pid %d) %s; starting it again", index, process.pid, ended(code))
            self.start(index)

    def crashing(self) -> bool:
        now = time.monotonic()
        self.deaths = [at for at in self.deaths if now - at < CRASH_WINDOW] + [now]
        return len(self.deaths) > CRASH_LIMIT * self.count

    def stop_all(self) -> None:
        """SIGTERM to every worker (each drains), then wait; kill what outlives the grace."""
        for process in self.workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + STOP_MARGIN
        while any(p.poll() is None for p in self.workers.values()) and time.monotonic() < deadline:
            self.wait(deadline - time.monotonic())
        for index, process in self.workers.items():
            if process.poll() is None:
                log.error("worker %d (pid %d) outlived the grace: killed", index, process.pid)
                process.kill()
            process.wait()


def ended(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"


def worker_argv(args: argparse.Namespace, host: str, port: int, fd: int) -> Callable[[int], list[str]]:
    """The command line of each worker: this one's, on the bound socket, without ``--workers``."""
    def command(index: int) -> list[str]:
        argv = [sys.executable, "-m", "server", "--host", host, "--port", str(port),
                "--log-level", args.log_level, "--worker-socket", str(fd), "--worker-index", str(index)]
        return argv + (["--config", args.config] if args.config else [])
    return command


def supervise(args: argparse.Namespace, settings: Settings, host: str, port: int,
              prepare: Callable[[], None] = lambda: None) -> int:
    """Bind, start ``args.workers`` workers and keep them running; the parent's exit code.
    ``prepare`` runs once before any worker starts (the store's creation and migrations)."""
    problem = workers_problem(settings, args.workers)
    if problem is not None:
        print(f"meterchat: {problem}", file=sys.stderr)
        return 2
    prepare()
    with listen(host, port) as sock:
        bound = int(sock.getsockname()[1])
        print(f"meterchat: serving on http://{host}:{bound}/ with {args.workers} workers "
              f"({settings.source}; default route {settings.default_route})", file=sys.stderr, flush=True)
        command = worker_argv(args, host, bound, sock.fileno())
        return Supervisor(command, args.workers, sock.fileno(), settings.server.shutdown_grace_seconds).run()


class WorkerServer(DrainingServer):
    """One worker: a ``DrainingServer`` on the parent's socket that says when it is ready, and drains
    and exits by itself when its parent is gone (a killed supervisor leaves no worker behind)."""

    def __init__(self, config: uvicorn.Config, app: Any, index: int) -> None:
        super().__init__(config, app)
        self.index = index
        self.parent = os.getppid()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("worker %d ready (pid %d)", self.index, os.getpid())

    async def on_tick(self, counter: int) -> bool:
        if os.getppid() != self.parent:
            return True
        return await super().on_tick(counter)
