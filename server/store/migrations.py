"""Schema migrations: numbered steps that every store backend runs once, recorded in the database.

A ``Migration`` is a version, a name and its SQL in each dialect (SQLite, PostgreSQL). Opening a
store applies, in ONE transaction under the backend's write lock, every migration whose version is
not yet in the ``schema_migrations`` table, and records each (version, name, applied_at). So two
servers starting at once on one database apply each step once, and a failed step leaves nothing.

Rules for adding one: a released migration's SQL never changes (some database has already run it);
a new column or table is a new, higher version appended to ``MIGRATIONS``; every statement is
idempotent (``IF NOT EXISTS``) so a database that already holds the objects adopts them. That is how
a SQLite file made before this table existed loads: its tables are migration 1, verbatim.

A database recording a version above the newest known stops start-up with ``ConfigError``: a newer
meterchat wrote it. SQLite files also keep the ``schema_version`` row that meterchat read before
migrations existed, set to the newest applied version, so an older binary refuses a newer file too.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from server.errors import ConfigError

if TYPE_CHECKING:
    import psycopg


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sqlite: str
    postgres: str


# Version 1 for SQLite is the schema meterchat created before migrations, character for character.
_SQLITE_1 = """
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

# PostgreSQL keeps a message as one JSON document (``message_to_data``): the codec is
# the single description of a message, and ``json`` (unlike ``jsonb`` and ``text``) keeps a NUL
# character a model may emit. Timestamps stay ISO-8601 text so both backends sort them alike.
_POSTGRES_1 = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, route TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id TEXT NOT NULL, position DOUBLE PRECISION NOT NULL, data JSON NOT NULL,
    PRIMARY KEY (session_id, id));
CREATE INDEX IF NOT EXISTS messages_order ON messages (session_id, position);
CREATE TABLE IF NOT EXISTS calls (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id TEXT, provider TEXT NOT NULL, model TEXT NOT NULL, route_kind TEXT NOT NULL,
    input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL, tokens_source TEXT NOT NULL,
    cost_usd DOUBLE PRECISION, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS calls_session ON calls (session_id, seq);
"""

# Version 2: what a reload needs to draw what the live page showed (issue 10): when each message was
# written, which turn a user message replaced, a reply's reasoning, and the trims with where they
# happened. SQLite has no ADD COLUMN IF NOT EXISTS: these run once, recorded like every step (no
# released file holds the columns without the record). PostgreSQL keeps a message as one JSON
# document, so only the trims table is new there.
_SQLITE_2 = """
ALTER TABLE messages ADD COLUMN created_at TEXT;
ALTER TABLE messages ADD COLUMN replaces TEXT;
ALTER TABLE messages ADD COLUMN thinking TEXT;
CREATE TABLE IF NOT EXISTS trims (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    data TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trims_session ON trims (session_id, seq);
"""
_POSTGRES_2 = """
CREATE TABLE IF NOT EXISTS trims (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    data JSON NOT NULL, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trims_session ON trims (session_id, seq);
"""

# Windows a provider named in its own context-overflow error, by (provider alias, model).
_WINDOWS = """
CREATE TABLE IF NOT EXISTS route_windows (
    provider TEXT NOT NULL, model TEXT NOT NULL, tokens INTEGER NOT NULL, learned_at TEXT NOT NULL,
    PRIMARY KEY (provider, model));
"""

# The session search: SQLite keeps an FTS5 index of message text, filled from the messages already
# stored and kept by triggers; PostgreSQL a GIN index of the text's tsvector (the 'simple' config:
# no stemming, so both backends match a word or its prefix alike).
_SQLITE_4 = """
CREATE VIRTUAL TABLE IF NOT EXISTS message_text USING fts5(content, session_id UNINDEXED);
INSERT INTO message_text (rowid, content, session_id)
    SELECT rowid, content, session_id FROM messages WHERE rowid NOT IN (SELECT rowid FROM message_text);
CREATE TRIGGER IF NOT EXISTS message_text_insert AFTER INSERT ON messages BEGIN
    INSERT INTO message_text (rowid, content, session_id) VALUES (new.rowid, new.content, new.session_id);
END;
CREATE TRIGGER IF NOT EXISTS message_text_update AFTER UPDATE OF content ON messages BEGIN
    UPDATE message_text SET content = new.content WHERE rowid = old.rowid;
END;
CREATE TRIGGER IF NOT EXISTS message_text_delete AFTER DELETE ON messages BEGIN
    DELETE FROM message_text WHERE rowid = old.rowid;
END;
"""
# A message's text as PostgreSQL can index it: ``json`` keeps a NUL (``\\u0000``) that text cannot
# hold, so the escape is taken out of the document's text before its content is read.
PG_MESSAGE_TEXT = "to_tsvector('simple', replace(data::text, '\\u0000', '')::json->>'content')"
_POSTGRES_4 = f"""
CREATE INDEX IF NOT EXISTS messages_text ON messages USING GIN ({PG_MESSAGE_TEXT});
"""

# Version 5: the transcript's other lines (a turn's error, notices, a switch, a typed command), kept
# with where they happened so a reload draws them again (``server.sessions.notices``).
_SQLITE_5 = """
CREATE TABLE IF NOT EXISTS notices (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    data TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS notices_session ON notices (session_id, seq);
"""
_POSTGRES_5 = """
CREATE TABLE IF NOT EXISTS notices (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    data JSON NOT NULL, created_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS notices_session ON notices (session_id, seq);
"""

# Version 6: a streaming reply is checkpointed every store_flush_ms with its whole text so far;
# re-indexing that text each time cost the server more CPU than any other part of a paced stream (a
# reply's index work grows with the square of its length). The index now follows a message once it is complete
# (``interrupted`` = 0); the store indexes a reply that ends interrupted (stopped, failed) at its final
# save. PostgreSQL's expression index has no such switch: it is left as it is.
_SQLITE_6 = """
DROP TRIGGER IF EXISTS message_text_update;
CREATE TRIGGER IF NOT EXISTS message_text_update AFTER UPDATE OF content ON messages
    WHEN new.interrupted = 0 BEGIN
    UPDATE message_text SET content = new.content WHERE rowid = old.rowid;
END;
"""

# Version 7: accounts (issue 19). Users (``subject``: the OIDC provider's ``sub`` for an account
# that signs in there), their sign-ins (the cookie's id kept only as its SHA-256) and
# API tokens (likewise hashed); every session gets an owner. Sessions stored before this stay
# ownerless until the first admin account exists, which then takes them all (``claim_orphans``):
# nothing is lost and nothing is shown to the wrong person.
_ACCOUNTS = """
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, role TEXT NOT NULL,
    password_hash TEXT, created_at TEXT NOT NULL, disabled INTEGER NOT NULL, subject TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS users_name ON users (lower(name));
CREATE UNIQUE INDEX IF NOT EXISTS users_subject ON users (subject);
CREATE TABLE IF NOT EXISTS logins (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at TEXT NOT NULL, expires_at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS logins_user ON logins (user_id);
CREATE TABLE IF NOT EXISTS api_tokens (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL, last_used TEXT);
CREATE INDEX IF NOT EXISTS api_tokens_user ON api_tokens (user_id);
"""
_SQLITE_7 = _ACCOUNTS + """
ALTER TABLE sessions ADD COLUMN owner_id TEXT;
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner_id, updated_at);
"""
_POSTGRES_7 = _ACCOUNTS + """
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS owner_id TEXT;
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner_id, updated_at);
"""

# Version 8: a reply keeps the route its call was sent to (``ChatMessage.served_by``). The call's
# record says so only once the call ends; a reply cut short by a crash had no record and showed no
# model after the restart. PostgreSQL keeps a message as one JSON document: nothing to add there.
_SQLITE_8 = """
ALTER TABLE messages ADD COLUMN served_by TEXT;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sessions, messages and calls", _SQLITE_1, _POSTGRES_1),
    Migration(2, "message times, versions and thinking; trims", _SQLITE_2, _POSTGRES_2),
    Migration(3, "windows learned from overflow errors", _WINDOWS, _WINDOWS),
    Migration(4, "session search", _SQLITE_4, _POSTGRES_4),
    Migration(5, "transcript notices", _SQLITE_5, _POSTGRES_5),
    Migration(6, "search index skips streaming checkpoints", _SQLITE_6, ""),
    Migration(7, "accounts: users, sign-ins, API tokens, session owners", _SQLITE_7, _POSTGRES_7),
    Migration(8, "the route each reply was written by", _SQLITE_8, ""),
)

_RECORDS = ("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
            "name TEXT NOT NULL, applied_at TEXT NOT NULL)")
_TRIGGER = re.compile(r"\bCREATE\s+TRIGGER\b", re.IGNORECASE)
_END = re.compile(r"\bEND\s*$", re.IGNORECASE)
# Any constant: it names the lock that serialises servers migrating one PostgreSQL database.
_PG_LOCK = 0x6D657465


def statements(script: str) -> list[str]:
    """The statements of a migration (its SQL holds no ``;`` inside a literal); a trigger's body,
    ``BEGIN ... END``, stays one statement."""
    found: list[str] = []
    pending = ""
    for part in script.split(";"):
        pending = f"{pending};{part}" if pending else part
        if _TRIGGER.search(pending) and not _END.search(pending):
            continue
        if pending.strip():
            found.append(pending.strip())
        pending = ""
    return found


def refuse_newer(versions: Iterable[int], migrations: Sequence[Migration], where: str) -> None:
    seen, newest = max(versions, default=0), max(m.version for m in migrations)
    if seen > newest:
        raise ConfigError(f"{where}: written by a newer meterchat (schema {seen}, "
                          f"this one reads up to {newest})")


def pending(applied: Iterable[int], migrations: Sequence[Migration], where: str) -> list[Migration]:
    """The migrations to run, in order; a database newer than ``migrations`` is refused."""
    done = set(applied)
    refuse_newer(done, migrations, where)
    return sorted((m for m in migrations if m.version not in done), key=lambda m: m.version)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def migrate_sqlite(conn: sqlite3.Connection, where: str,
                   migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply what is pending to an autocommit (``isolation_level=None``) connection; the versions run."""
    conn.execute("BEGIN IMMEDIATE")  # the write lock: a second process waits, then finds it done
    try:
        ran = _sqlite_steps(conn, where, migrations)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return ran


def _sqlite_steps(conn: sqlite3.Connection, where: str, migrations: Sequence[Migration]) -> list[int]:
    conn.execute(_RECORDS)
    recorded = [row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
    refuse_newer([_legacy_version(conn)], migrations, where)
    todo = pending(recorded, migrations, where)
    for migration in todo:
        for statement in statements(migration.sqlite):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                     (migration.version, migration.name, _now()))
    newest = max([*recorded, *(m.version for m in todo)])
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version VALUES (?)", (newest,))
    return [m.version for m in todo]


def _legacy_version(conn: sqlite3.Connection) -> int:
    """The pre-migrations record (one row in ``schema_version``); 0 when the file has none."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
    if exists.fetchone() is None:
        return 0
    row: Any = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate_postgres(conn: psycopg.Connection[Any], where: str,
                     migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply what is pending in one transaction under an advisory lock; the versions run."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK,))
        conn.execute(_RECORDS)
        recorded = [row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
        todo = pending(recorded, migrations, where)
        for migration in todo:
            for statement in statements(migration.postgres):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, %s)",
                         (migration.version, migration.name, _now()))
    return [m.version for m in todo]
