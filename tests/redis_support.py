"""A private ``redis-server`` for the live-mode tests: a free port on 127.0.0.1, a temporary
directory, no persistence, no system service. Session-scoped (``redis_server``); a test that needs
a Redis of its own (one it restarts) asks ``fresh_redis``. Without the binary the tests fail and say
what to install (scripts/test installs Debian's ``redis-server``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

READY = "Ready to accept connections"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process; ``restart`` keeps the port and loses every key, as a real
    restart without persistence does."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: the live-mode tests need Debian's redis-server "
                        "(scripts/test installs it; or: apt-get install redis-server)")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for _ in range(5):  # the free port may be taken between the probe and the bind
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.directory), "--loglevel", "notice"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if self._wait_ready():
                return
            self.port = free_port()
        pytest.fail(f"redis-server did not start in {self.directory}")

    def _wait_ready(self) -> bool:
        """Read its log until it says it is ready (an event, not a timer), or it exits."""
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if READY in line:
                return True
        self.process.wait()
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
