"""Opening the embedded store's file: the connection, its pragmas (WAL, ``synchronous=NORMAL``,
foreign keys), the pending migrations, and the start-up checks. A file that cannot be opened, is not
a database, fails ``PRAGMA quick_check`` or cannot take a write stops start-up with a
``ConfigError`` naming the file and the problem, not the first reply."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from server.errors import ConfigError
from server.store.migrations import migrate_sqlite


def connect(path: Path, timeout: float) -> sqlite3.Connection:
    """The one connection to ``path`` (created with its folder if missing), migrated and checked.
    ``check_same_thread=False``: the store serialises its calls itself, on worker threads."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"{path}: cannot open the database: {_reason(exc)}") from exc
    try:
        _prepare(connection, path)
        _check(connection, path)
    except BaseException:
        connection.close()
        raise
    return connection


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _check(connection: sqlite3.Connection, path: Path) -> None:
    """Start-up: the file reads whole (quick_check) and takes a write, or start-up stops here
    rather than at the first reply."""
    try:
        problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise ConfigError(f"{path}: the database is corrupt (quick_check: {problems[0]})")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        connection.execute(f"PRAGMA user_version = {int(version)}")  # a write that changes nothing
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: {_problem(exc)}") from exc


def _problem(exc: sqlite3.Error) -> str:
    if isinstance(exc, sqlite3.DatabaseError) and any(
            word in str(exc) for word in ("malformed", "not a database")):
        return f"the database is corrupt ({exc}); restore a backup or move the file away"
    return f"the database cannot be used: {exc}"


def _prepare(connection: sqlite3.Connection, path: Path) -> None:
    try:
        _create(connection, path)
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: {_problem(exc)}") from exc


def _create(connection: sqlite3.Connection, path: Path) -> None:
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute("PRAGMA foreign_keys = ON")
    migrate_sqlite(connection, path.name)
