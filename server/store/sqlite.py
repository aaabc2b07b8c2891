"""The embedded store: one SQLite file, ``meterchat.sqlite3``, under the data directory.

WAL journal with ``synchronous=NORMAL``: a committed write survives the process being killed
(SIGKILL included); only a power cut can lose the last few commits. Opening runs the pending schema
migrations (``server.store.migrations``); a file written by a newer schema stops start-up.

Threading: one connection, opened with ``check_same_thread=False``. Calls run on a worker thread
(``anyio.to_thread.run_sync``), so the event loop never blocks on the disk; the calls that come
while one is on its way go together in one hop (``server.store.group.CallQueue``), under a
``threading.Lock``, so calls from any event loop (a test client's portal, the server's loop) are
safe. Messages are turned into rows on the caller's thread before the hand-off, so a reply still
streaming into a ``ChatMessage`` cannot change under the write.

Faults: an ``OperationalError`` at run time (disk full, read-only, locked past ``[store]
timeout_seconds``) is raised as ``StoreUnavailable``, as the PostgreSQL store does, so callers
handle one error whatever the backend; the transaction was rolled back and the same write may be
tried again. At start-up a file that is not a database, fails ``PRAGMA quick_check``, or cannot be
read or written stops start-up with a ``ConfigError`` naming the file and the problem
(``server.store.sqlite_file``).

Order: each message has a REAL ``position``; append takes ``max + 1`` (positions may be sparse),
``insert_message`` takes the midpoint of its neighbours and renumbers the session on the rare day
the floats run out of room between them.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar

from anyio.lowlevel import RunVar

from server.errors import SessionExists, StoreUnavailable, UnknownSession
from server.history.messages import ChatMessage
from server.store.base import (
    CALL_FIELDS,
    MESSAGE_FIELDS,
    MESSAGE_FLAGS,
    MESSAGE_JSON,
    MESSAGE_LISTS,
    MESSAGE_OBJECTS,
    CallRecord,
    Clock,
    SessionSummary,
    StoredSession,
    call_to_data,
    message_from_data,
    message_to_data,
    object_data,
)
from server.store.group import CallQueue
from server.store.search import SQLITE, SUMMARY, search_sql
from server.store.sqlite_file import connect
from server.store.sqlite_users import SqliteUsers

FILE_NAME = "meterchat.sqlite3"
T = TypeVar("T")

# The tables are the migrations' (``server.store.migrations``: version 1 is the schema written before
# migrations, verbatim; a new field needs a new migration). The message columns are the codec's
# (``server.store.base.MESSAGE_FIELDS``: flags as INTEGER 0/1, lists and objects as JSON TEXT); the
# test that reads a version-1 file holds the two together.
_FIELDS = MESSAGE_FIELDS[1:]  # the columns after (session_id, id, position)
_INSERT = (f"INSERT INTO messages (session_id, id, position, {', '.join(_FIELDS)}) "
           f"VALUES ({', '.join('?' * (len(_FIELDS) + 3))})")
_UPSERT = (_INSERT + " ON CONFLICT (session_id, id) DO UPDATE SET "
           + ", ".join(f"{name} = excluded.{name}" for name in _FIELDS))
# A streaming reply's checkpoint once its row exists: the row rewritten in place, the session
# untouched (its final write touches it), no position to find.
_CHECKPOINT = (f"UPDATE messages SET {', '.join(f'{name} = ?' for name in _FIELDS)} "
               "WHERE session_id = ? AND id = ?")
_CONTENT, _INTERRUPTED = (1 + _FIELDS.index(name) for name in ("content", "interrupted"))  # in a Row
_REINDEX = ("UPDATE message_text SET content = ? "
            "WHERE rowid = (SELECT rowid FROM messages WHERE session_id = ? AND id = ?)")
# A trim or a notice: its fields as JSON, in the table named (``trims``, ``notices``).
_INSERT_EVENT = "INSERT INTO {} (session_id, data, created_at) VALUES (?, ?, ?)"
_INSERT_SESSION = ("INSERT INTO sessions (id, title, route, created_at, updated_at, owner_id) "
                   "VALUES (?, ?, ?, ?, ?, ?)")
_SELECT = f"SELECT id, {', '.join(_FIELDS)} FROM messages WHERE session_id = ? ORDER BY position"

Row = tuple[Any, ...]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


@lru_cache(maxsize=256)
def _object_json(value: Any) -> str | None:
    """A frozen dataclass field (a reply's ``served_by``) as JSON text: one encoding for all the
    checkpoints of a reply, and of every reply its route writes."""
    return None if value is None else _json(object_data(value))


def _row(message: ChatMessage) -> Row:
    """(id, *fields) of ``message``; built on the caller's thread."""
    data = message_to_data(message)
    for name in MESSAGE_LISTS:
        data[name] = _json(data[name])
    for name in MESSAGE_OBJECTS:
        data[name] = _object_json(getattr(message, name))
    for name in MESSAGE_FLAGS:
        data[name] = int(data[name])
    return tuple(data.values())


def _message(row: Row) -> ChatMessage:
    data = dict(zip(MESSAGE_FIELDS, row, strict=True))
    for name in MESSAGE_JSON:
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return message_from_data(data)


class SqliteStore(SqliteUsers):
    """The ``server.store.base.Store`` contract on one SQLite file; build it with ``open_store``."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.path = path
        self._conn = connection
        self._lock = threading.Lock()
        self._clock = Clock()
        # Calls that come together take one hop; final writes of replies that end together go as
        # one transaction (``server.store.group``). A queue for each event loop, one lock for all.
        self._queues: RunVar[CallQueue] = RunVar(f"sqlite-calls-{id(self)}")

    @classmethod
    def open(cls, data_dir: str | Path, timeout: float = 10.0) -> SqliteStore:
        path = Path(data_dir) / FILE_NAME
        return cls(connect(path, timeout), path)

    @property
    def calls(self) -> CallQueue:
        """This event loop's queue of calls."""
        try:
            return self._queues.get()
        except LookupError:
            queue = CallQueue(self._conn, self._lock, self._write, _unavailable)
            self._queues.set(queue)
            return queue

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.calls.call(partial(fn, *args))

    def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` in one immediate transaction: committed when this returns, else rolled back."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(*args)
        except BaseException:
            if self._conn.in_transaction:  # SQLITE_FULL has rolled back already; say so, not that
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return result

    def _touch(self, session_id: str) -> str:
        now = self._clock.now()
        cursor = self._conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))
        if cursor.rowcount == 0:
            raise UnknownSession(f"no session {session_id!r}")
        return now

    def _next_position(self, session_id: str) -> float:
        row = self._conn.execute("SELECT MAX(position) FROM messages WHERE session_id = ?",
                                 (session_id,)).fetchone()
        return 0.0 if row[0] is None else float(row[0]) + 1.0

    async def close(self) -> None:
        await self._call(self._conn.close)

    async def ping(self) -> None:
        await self._call(self._query_one, "SELECT 1", ())

    # sessions

    async def create_session(self, session_id: str, *, title: str, route: str,
                             owner: str | None = None) -> None:
        await self._call(self._write, self._create, session_id, title, route, None, owner)

    def _create(self, session_id: str, title: str, route: str, created_at: str | None,
                owner: str | None) -> None:
        now = self._clock.now()
        try:
            self._conn.execute(_INSERT_SESSION, (session_id, title, route, created_at or now, now, owner))
        except sqlite3.IntegrityError as exc:
            raise SessionExists(f"session {session_id!r} already exists") from exc

    async def get_session(self, session_id: str) -> StoredSession | None:
        return await self._call(self._read_session, session_id)

    def _read_session(self, session_id: str) -> StoredSession | None:
        self._conn.execute("BEGIN")  # one snapshot for the three reads
        try:
            head = self._conn.execute("SELECT id, title, route, created_at, updated_at, owner_id "
                                      "FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is None:
                return None
            messages = [_message(row) for row in self._conn.execute(_SELECT, (session_id,))]
            calls = [CallRecord(*row) for row in self._conn.execute(
                f"SELECT {', '.join(CALL_FIELDS)} FROM calls WHERE session_id = ? ORDER BY seq",
                (session_id,))]
            trims = [{"created_at": at, **json.loads(data)} for data, at in self._conn.execute(
                "SELECT data, created_at FROM trims WHERE session_id = ? ORDER BY seq", (session_id,))]
            notices = [{"created_at": at, **json.loads(data)} for data, at in self._conn.execute(
                "SELECT data, created_at FROM notices WHERE session_id = ? ORDER BY seq", (session_id,))]
        finally:
            self._conn.execute("COMMIT")
        session_id, title, route, created_at, updated_at, owner = head
        return StoredSession(session_id, title, route, created_at, updated_at, messages, calls, trims,
                             notices, owner)

    async def get_summary(self, session_id: str) -> SessionSummary | None:
        row = await self._call(self._query_one, SUMMARY + " WHERE s.id = ?", (session_id,))
        return None if row is None else SessionSummary(*row)

    async def list_sessions(self, query: str = "", before: str | None = None, limit: int | None = None,
                            before_id: str | None = None, owner: str | None = None) -> list[SessionSummary]:
        """Sessions, most recently updated first: all, or those whose title or text matches."""
        rows = await self._call(self._query, *search_sql(SQLITE, query, before, limit, before_id, owner))
        return [SessionSummary(*row) for row in rows]

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        return self._conn.execute(sql, params).fetchall()

    def _query_one(self, sql: str, params: tuple[Any, ...]) -> Row | None:
        return self._conn.execute(sql, params).fetchone()

    async def rename_session(self, session_id: str, title: str) -> None:
        await self._call(self._write, self._set_field, session_id, "title", title)

    async def set_route(self, session_id: str, route: str) -> None:
        await self._call(self._write, self._set_field, session_id, "route", route)

    def _set_field(self, session_id: str, column: str, value: str) -> None:
        self._touch(session_id)
        self._conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?", (value, session_id))

    async def delete_session(self, session_id: str) -> None:
        """Remove the session with its messages and calls (foreign keys cascade)."""
        await self._call(self._write, self._delete, session_id)

    def _delete(self, session_id: str) -> None:
        if self._conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
            raise UnknownSession(f"no session {session_id!r}")

    # messages and calls

    async def append_messages(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        rows = [_row(message) for message in messages]
        await self._call(self._write, self._put_rows, session_id, rows, _INSERT)

    async def save_messages(self, session_id: str, messages: Sequence[ChatMessage],
                            calls: Sequence[CallRecord] = ()) -> None:
        rows = [_row(message) for message in messages]
        await self.calls.write(partial(self._put_final, session_id, rows, calls))

    def _put_final(self, session_id: str, rows: list[Row], calls: Sequence[CallRecord] = ()) -> None:
        touched = self._put_rows(session_id, rows, _UPSERT) if rows or not calls else None
        if calls:
            self._put_calls(session_id, calls, touched)
        # The index trigger skips interrupted rows (the checkpoints of a streaming reply, written by
        # save_batch); a message saved interrupted for good is indexed here (migration 6).
        for row in rows:
            if row[_INTERRUPTED]:
                self._conn.execute(_REINDEX, (row[_CONTENT], session_id, row[0]))

    async def save_batch(self, batch: Mapping[str, Sequence[ChatMessage]]) -> None:
        work = [(session_id, [_row(message) for message in messages])
                for session_id, messages in batch.items()]
        await self._call(self._write, self._put_batch, work)

    def _put_batch(self, work: list[tuple[str, list[Row]]]) -> None:
        execute = self._conn.execute
        for session_id, rows in work:
            # A reply's first checkpoint inserts its row; the later ones rewrite it in place.
            new = [row for row in rows if execute(_CHECKPOINT, (*row[1:], session_id, row[0])).rowcount == 0]
            if not new:
                continue
            try:
                self._put_rows(session_id, new, _UPSERT)
            except UnknownSession:  # deleted while it streamed; nothing of it was written
                continue

    def _put_rows(self, session_id: str, rows: list[Row], sql: str) -> str:
        now = self._touch(session_id)
        position = self._next_position(session_id)
        # An upsert of a known id keeps its position, so the unused numbers leave gaps; harmless.
        for offset, row in enumerate(rows):
            self._conn.execute(sql, (session_id, row[0], position + offset, *row[1:]))
        return now

    async def insert_message(self, session_id: str, index: int, message: ChatMessage) -> None:
        """Place ``message`` so it becomes the ``index``-th (clamped to the ends) of the session."""
        await self._call(self._write, self._insert_at, session_id, index, _row(message))

    def _insert_at(self, session_id: str, index: int, row: Row) -> None:
        self._touch(session_id)
        position = self._position_for(session_id, max(index, 0))
        if position is None:
            self._renumber(session_id)
            position = self._position_for(session_id, max(index, 0))
        self._conn.execute(_INSERT, (session_id, row[0], position, *row[1:]))

    def _position_for(self, session_id: str, index: int) -> float | None:
        positions = [row[0] for row in self._conn.execute(
            "SELECT position FROM messages WHERE session_id = ? ORDER BY position", (session_id,))]
        if index >= len(positions):
            return positions[-1] + 1.0 if positions else 0.0
        after = positions[index]
        before = positions[index - 1] if index > 0 else after - 2.0
        middle = (before + after) / 2
        return middle if before < middle < after else None

    def _renumber(self, session_id: str) -> None:
        ids = [row[0] for row in self._conn.execute(
            "SELECT id FROM messages WHERE session_id = ? ORDER BY position", (session_id,))]
        self._conn.executemany("UPDATE messages SET position = ? WHERE session_id = ? AND id = ?",
                               [(float(i), session_id, mid) for i, mid in enumerate(ids)])

    async def record_call(self, session_id: str, call: CallRecord) -> None:
        await self._call(self._write, self._put_calls, session_id, [call])

    def _put_calls(self, session_id: str, calls: Sequence[CallRecord], touched: str | None = None) -> None:
        now = touched or self._touch(session_id)  # touched: in this transaction already
        self._conn.executemany(
            f"INSERT INTO calls (session_id, {', '.join(CALL_FIELDS)}) "
            f"VALUES ({', '.join('?' * (len(CALL_FIELDS) + 1))})",
            [(session_id, *_call_row(call, now)) for call in calls])

    # windows learned from overflow errors

    async def load_windows(self) -> dict[tuple[str, str], int]:
        rows = await self._call(self._query, "SELECT provider, model, tokens FROM route_windows", ())
        return {(provider, model): tokens for provider, model, tokens in rows}

    async def save_window(self, provider: str, model: str, tokens: int) -> None:
        await self._call(self._write, self._conn.execute,
                         "INSERT INTO route_windows VALUES (?, ?, ?, ?) ON CONFLICT (provider, model) "
                         "DO UPDATE SET tokens = excluded.tokens, learned_at = excluded.learned_at",
                         (provider, model, tokens, self._clock.now()))

    async def record_trim(self, session_id: str, trim: Mapping[str, Any],
                          marked: Sequence[ChatMessage] = ()) -> None:
        """Keep a ``history_trimmed`` event (its fields) so a reload shows the notice again, and save
        the messages it marked, in one transaction."""
        rows = [_row(message) for message in marked]
        await self._call(self._write, self._put_trim, session_id, _json(dict(trim)), rows)

    def _put_trim(self, session_id: str, data: str, rows: list[Row]) -> None:
        self._put_final(session_id, rows)
        self._put_event("trims", session_id, data)

    async def record_notice(self, session_id: str, notice: Mapping[str, Any]) -> None:
        """Keep a line of the transcript (an error, a notice, a switch) for a reload."""
        await self._call(self._write, self._put_event, "notices", session_id, _json(dict(notice)))

    def _put_event(self, table: str, session_id: str, data: str) -> None:
        now = self._touch(session_id)
        self._conn.execute(_INSERT_EVENT.format(table), (session_id, data, now))

    async def import_session(self, session: StoredSession, owner: str | None = None) -> None:
        """Write a whole session (from an export) at once, owned by ``owner``; its id must be new."""
        rows = [_row(message) for message in session.messages]
        await self._call(self._write, self._import, session, rows, owner)

    def _import(self, session: StoredSession, rows: list[Row], owner: str | None) -> None:
        self._create(session.id, session.title, session.route, session.created_at, owner)
        self._put_rows(session.id, rows, _INSERT)
        self._put_calls(session.id, session.calls)
        for table, lines in (("trims", session.trims), ("notices", session.notices)):
            self._conn.executemany(_INSERT_EVENT.format(table),
                                   [(session.id, _json(line), line["created_at"]) for line in lines])


def _unavailable(exc: Exception) -> Exception:
    """What a caller sees of an error SQLite raised: a refusal (``OperationalError``: disk full,
    read-only, locked too long) as ``StoreUnavailable``, anything else as it is."""
    if not isinstance(exc, sqlite3.OperationalError):
        return exc
    error = StoreUnavailable(f"the session store refused the write ({exc}); "
                             "what was not written is kept and written when it recovers")
    error.__cause__ = exc
    return error


def _call_row(call: CallRecord, now: str) -> Row:
    data = call_to_data(call)
    data["created_at"] = call.created_at or now
    return tuple(data.values())
