"""A private PostgreSQL cluster for the tests: Debian's binaries, a temporary directory, a free port.

``running_cluster()`` runs ``initdb`` and ``postgres`` (no system service, no ``pg_ctl``), waits for
the server's own "ready to accept connections" line, and on exit stops it and removes the directory.
Run as root, both run as an unprivileged user (``nobody``) that owns the directory, because
PostgreSQL refuses to run as root. Without the binaries the fixture FAILS with a message saying what
to install: the store's tests are part of the suite, and a silent skip would hide a backend.

Each test asks the cluster for a fresh database (``new_database``), so tests never share rows.
Use as a pytest plugin (``pytest_plugins``): it provides the session-scoped ``pg_cluster`` fixture.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

USER = "meterchat"
READY = "database system is ready to accept connections"
START_SECONDS = 60
# Speed over durability: the tests kill clients, never this server, so its own crash safety is moot.
FAST = ("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")


class PostgresMissing(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` holding both ``initdb`` and ``postgres``."""
    found = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")
             if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "postgres", os.X_OK)]
    if not found:
        raise PostgresMissing(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: install Debian's "
            "`postgresql` package (scripts/test does it: apt-get install postgresql)")
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as() -> dict[str, Any]:
    """Popen arguments that drop root to ``nobody``; nothing when not root."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


class PgCluster:
    """A private server on ``folder``; ``url()`` names one of its databases. ``stop()`` and
    ``start()`` again keep the data and the port, as an operator's restart would."""

    def __init__(self, bin_dir: Path, folder: Path, owner: dict[str, Any]) -> None:
        self.bin_dir, self.folder, self.owner = bin_dir, folder, owner
        self.port = free_port()
        self.log: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        self._watcher: threading.Thread | None = None
        self._names = itertools.count()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        name = f"test_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def start(self) -> None:
        """Start the server and return once it says it accepts connections."""
        self._process = process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.folder / "data"), "-k", str(self.folder),
             "-h", "127.0.0.1", "-p", str(self.port), *FAST],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            **self.owner)
        ready = threading.Event()
        self._watcher = threading.Thread(target=_watch, args=(process, self.log, ready), daemon=True)
        self._watcher.start()
        if not ready.wait(START_SECONDS) or process.poll() is not None:
            self.stop()
            raise RuntimeError("postgres did not start:\n" + "".join(self.log))

    def stop(self) -> None:
        """A "fast" shutdown (SIGINT): clients are disconnected, as when a database goes away."""
        process, watcher = self._process, self._watcher
        if process is None or watcher is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # SIGTERM's "smart" shutdown would wait for clients
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        watcher.join()  # it ends at the pipe's end of file; then the pipe can close
        assert process.stderr is not None
        process.stderr.close()
        self._process = self._watcher = None


def _initdb(bin_dir: Path, data: Path, owner: dict[str, Any]) -> None:
    result = subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data), "--auth=trust", "-U", USER, "--no-locale",
         "-E", "UTF8", "--no-sync"],
        capture_output=True, text=True, check=False, **owner)
    if result.returncode != 0:
        raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")


def _watch(process: subprocess.Popen[str], log: list[str], ready: threading.Event) -> None:
    """Drain the server's log (a full pipe would stall it) and flag the ready line."""
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)
        if READY in line:
            ready.set()
    ready.set()  # the server exited: wake the waiter, who sees the exit code


def _start_on_a_free_port(cluster: PgCluster, tries: int = 3) -> None:
    """Another program may take the free port between our probe and the server's bind: try anew."""
    for attempt in range(tries):
        try:
            cluster.start()
            return
        except RuntimeError:
            if attempt == tries - 1:
                raise
            cluster.port = free_port()


@contextlib.contextmanager
def running_cluster() -> Iterator[PgCluster]:
    """Start a private cluster; stop it and delete its files on exit."""
    bin_dir = find_bin_dir()
    owner = _run_as()
    folder = Path(tempfile.mkdtemp(prefix="meterchat-pg-"))
    try:
        if owner:
            os.chown(folder, owner["user"], owner["group"])
        _initdb(bin_dir, folder / "data", owner)
        cluster = PgCluster(bin_dir, folder, owner)
        _start_on_a_free_port(cluster)
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        with running_cluster() as cluster:
            yield cluster
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)
