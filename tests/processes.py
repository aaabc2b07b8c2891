"""Whole processes in tests (``python -m server``, nginx, ``--workers``): the output is read in a
thread so a test waits for a line or for a condition on the lines (an event, never a sleep), and
every process is stopped and its pipe closed, even when it fails to start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tests.redis_support import free_port

STARTED = "Uvicorn running on"  # a meterchat process has bound its port


class LoggedProcess:
    """A child whose stdout and stderr are read together in a thread; ready once ``ready`` (a text
    or a condition on the process) holds, within ``timeout`` seconds, or stopped and raised."""

    def __init__(self, args: list[str], ready: str | Callable[[], bool], timeout: float = 30,
                 stop_timeout: float = 10, cwd: Path | None = None) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.exited = False
        self.stop_timeout = stop_timeout
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        cwd=cwd)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        condition = ready if callable(ready) else (lambda: self.printed(ready))
        if not self.wait_until(condition, timeout):
            self.stop()
            raise RuntimeError(f"{' '.join(args[:3])} did not start:\n" + self.tail())

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line)
                self.heard(line)
                self.changed.notify_all()
        with self.changed:
            self.exited = True
            self.changed.notify_all()

    def heard(self, line: str) -> None:
        """Called with each line as it arrives (the lock held): for subclasses that follow state."""

    def printed(self, text: str, count: int = 1) -> bool:
        return sum(text in line for line in self.lines) >= count

    def tail(self, lines: int = 40) -> str:
        return "".join(self.lines[-lines:])

    def wait_until(self, condition: Callable[[], bool], timeout: float = 10) -> bool:
        """True once ``condition`` holds; False if the process ended first or the timeout passed."""
        with self.changed:
            return self.changed.wait_for(lambda: self.exited or condition(), timeout) and condition()

    def wait_for(self, text: str, timeout: float = 10, count: int = 1) -> bool:
        """True once ``count`` lines containing ``text`` were printed."""
        return self.wait_until(lambda: self.printed(text, count), timeout)

    def expect(self, condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """``wait_until`` that fails the test with the end of the output."""
        if not self.wait_until(condition, timeout):
            state = "exited" if self.exited else "timed out"
            raise AssertionError(f"{state} before {what}:\n" + self.tail())

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.reader.join(10)  # the pipe is at its end once the process is gone
        if self.process.stdout is not None:
            self.process.stdout.close()


class Server(LoggedProcess):
    """``python -m server`` with ``config`` on a free port of 127.0.0.1 (tried again when the port
    was taken between the probe and the bind)."""

    def __init__(self, config: Path, *options: str) -> None:
        failure = RuntimeError("meterchat did not start")
        for _ in range(3):
            self.port = free_port()
            try:
                super().__init__([sys.executable, "-m", "server", "--config", str(config), "--port",
                                  str(self.port), "--log-level", "info", *options], STARTED)
                return
            except RuntimeError as exc:
                failure = exc
        raise failure

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"
