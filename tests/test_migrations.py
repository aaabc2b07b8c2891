"""Schema migrations: numbered, recorded in ``schema_migrations``, idempotent, atomic, refused when
newer, safe when two servers start at once; and a SQLite file written before migrations still loads."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from server.errors import ConfigError
from server.history.messages import stored_marks
from server.store.backends import open_store
from server.store.migrations import MIGRATIONS, Migration, migrate_postgres, migrate_sqlite
from server.store.sqlite import FILE_NAME
from tests.pg_support import PgCluster

# What meterchat wrote before migrations existed (store_sqlite.py at the commit before them),
# kept here verbatim: migration 1 must stay this, and files made by it must keep loading.
BEFORE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, route TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id TEXT NOT NULL, position REAL NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    tool_calls TEXT, tool_call_id TEXT, images TEXT, name TEXT,
    breadcrumb INTEGER NOT NULL, summary INTEGER NOT NULL, trimmed INTEGER NOT NULL,
    excluded TEXT, interrupted INTEGER NOT NULL, turn_id TEXT,
    PRIMARY KEY (session_id, id));
CREATE INDEX IF NOT EXISTS messages_order ON messages (session_id, position);
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id TEXT, provider TEXT NOT NULL, model TEXT NOT NULL, route_kind TEXT NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, tokens_source TEXT NOT NULL,
    cost_usd REAL, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS calls_session ON calls (session_id, seq);
"""
# Rows as that code wrote them: JSON text for tool calls and images, 0/1 for the marks.
OLD_ROWS = """
INSERT INTO schema_version VALUES (1);
INSERT INTO sessions VALUES ('old', 'Old ✓', 'demo/demo-small', '2026-01-01T00:00:00.000000+00:00',
    '2026-01-01T00:00:01.000000+00:00');
INSERT INTO messages VALUES ('old', 'm1', 0.0, 'user', 'look', NULL, NULL,
    '[{"media_type": "image/png", "data": "aGVsbG8="}]', NULL, 0, 0, 1, NULL, 0, 't1');
INSERT INTO messages VALUES ('old', 'm2', 1.0, 'assistant', '', '[{"id": "c1", "name": "search",
    "arguments": {"q": "x"}}]', NULL, NULL, NULL, 0, 0, 0, 'compacted', 1, 't1');
INSERT INTO calls (session_id, turn_id, provider, model, route_kind, input_tokens, output_tokens,
    tokens_source, cost_usd, created_at) VALUES ('old', 't1', 'demo', 'demo-small', 'default', 10, 5,
    'provider', 0.25, '2026-01-01T00:00:01.000000+00:00');
"""
SHIPPED = [m.version for m in MIGRATIONS]  # the steps this meterchat runs on a new database
NEXT = SHIPPED[-1] + 1  # a step a later meterchat adds
ADD_NOTES = Migration(NEXT, "session notes", "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY)",
                      "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY)")
BROKEN = Migration(NEXT, "broken", "CREATE TABLE half (id TEXT); SELECT no_such_column FROM half",
                   "CREATE TABLE half (id TEXT); SELECT no_such_column FROM half")


def sqlite_connection(folder: Path) -> sqlite3.Connection:
    folder.mkdir(parents=True, exist_ok=True)
    return sqlite3.connect(folder / FILE_NAME, isolation_level=None, check_same_thread=False, timeout=10)


@dataclass
class Database:
    """A fresh database of one backend, and the migration runner of that backend."""

    connect: Callable[[], Any]
    runner: Callable[..., list[int]]

    def migrate(self, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
        with closing(self.connect()) as conn:
            return self.runner(conn, "test db", migrations)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with closing(self.connect()) as conn:
            return list(conn.execute(sql).fetchall())


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        return Database(partial(sqlite_connection, tmp_path), migrate_sqlite)
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return Database(partial(psycopg.connect, cluster.new_database()), migrate_postgres)


def versions(database: Database) -> list[int]:
    return [row[0] for row in database.rows("SELECT version FROM schema_migrations ORDER BY version")]


def test_migrations_record_each_version_once(database: Database) -> None:
    assert database.migrate() == SHIPPED == [1, 2, 3, 4, 5, 6, 7, 8]
    assert database.migrate() == []
    recorded = database.rows("SELECT version, name FROM schema_migrations ORDER BY version")
    assert [row[:2] for row in recorded] == \
        [(1, "sessions, messages and calls"), (2, "message times, versions and thinking; trims"),
         (3, "windows learned from overflow errors"), (4, "session search"), (5, "transcript notices"),
         (6, "search index skips streaming checkpoints"),
         (7, "accounts: users, sign-ins, API tokens, session owners"),
         (8, "the route each reply was written by")]


def test_migrations_the_real_ones_apply_in_order(database: Database) -> None:
    assert database.migrate(MIGRATIONS) == [m.version for m in MIGRATIONS]
    assert database.migrate(MIGRATIONS) == []
    assert versions(database) == [m.version for m in MIGRATIONS]


def test_migrations_apply_a_new_version_on_the_next_open(database: Database) -> None:
    database.migrate()
    assert database.migrate((*MIGRATIONS, ADD_NOTES)) == [NEXT]
    assert database.migrate((*MIGRATIONS, ADD_NOTES)) == []
    assert database.rows("SELECT COUNT(*) FROM notes") == [(0,)]
    assert versions(database) == [*SHIPPED, NEXT]


def test_migrations_a_failing_step_leaves_nothing(database: Database) -> None:
    database.migrate()
    with pytest.raises((sqlite3.Error, psycopg.Error)):
        database.migrate((*MIGRATIONS, BROKEN))
    assert versions(database) == SHIPPED
    with pytest.raises((sqlite3.Error, psycopg.Error)):
        database.rows("SELECT * FROM half")  # its first statement was rolled back too


def test_migrations_refuse_a_database_from_a_newer_meterchat(database: Database) -> None:
    database.migrate((*MIGRATIONS, ADD_NOTES))
    with pytest.raises(ConfigError, match=rf"test db: written by a newer meterchat \(schema {NEXT}, "
                                          rf"this one reads up to {NEXT - 1}\)"):
        database.migrate()


def test_migrations_servers_starting_at_once_apply_each_step_once(database: Database) -> None:
    results: list[list[int]] = []
    barrier = threading.Barrier(3)

    def start() -> None:
        with closing(database.connect()) as conn:  # each "server" on its own connection
            barrier.wait()
            results.append(database.runner(conn, "db", MIGRATIONS))

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [[], [], SHIPPED]
    assert versions(database) == SHIPPED


def test_migrations_sqlite_version_one_is_the_schema_before_migrations() -> None:
    assert MIGRATIONS[0].version == 1
    assert MIGRATIONS[0].sqlite == BEFORE_MIGRATIONS


@pytest.mark.anyio
async def test_migrations_a_file_from_before_migrations_loads(tmp_path: Path) -> None:
    with closing(sqlite_connection(tmp_path)) as raw:
        raw.executescript(BEFORE_MIGRATIONS + OLD_ROWS)
    store = open_store(tmp_path)
    session = await store.get_session("old")
    await store.close()
    assert session is not None and session.title == "Old ✓"
    look, call = session.messages
    assert look.images is not None and call.tool_calls is not None
    assert (look.images[0].data, stored_marks(look), look.turn_id) == ("aGVsbG8=", (True, None), "t1")
    assert (call.tool_calls[0].arguments, stored_marks(call), call.interrupted) == (
        {"q": "x"}, (False, "compacted"), True)
    assert session.calls[0].cost_usd == 0.25
    with closing(sqlite_connection(tmp_path)) as raw:
        # the old file is migration 1 as it stands; the later steps run on it
        assert raw.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall() == \
            [(v,) for v in SHIPPED]
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SHIPPED[-1],)]


@pytest.mark.anyio
async def test_migrations_keep_the_old_version_row_for_older_binaries(tmp_path: Path) -> None:
    await open_store(tmp_path).close()
    with closing(sqlite_connection(tmp_path)) as raw:
        assert migrate_sqlite(raw, "db", (*MIGRATIONS, ADD_NOTES)) == [NEXT]
        # meterchat before migrations reads only this row, and refuses a file above its schema 1
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(NEXT,)]
