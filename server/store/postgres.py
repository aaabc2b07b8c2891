"""The server-grade store: PostgreSQL through psycopg 3 and its async connection pool.

Chosen by ``[store] url = "postgresql://..."``. Several meterchat instances may share one database:
every write is one transaction, and writes to one session queue on its ``sessions`` row (each write
first updates ``updated_at``, which locks the row), so positions computed inside a write never
collide. A message is one JSON document (``message_to_data``) beside its key and order;
calls keep typed columns so usage can be summed in SQL.

Opening (``PostgresStore.open``) connects once, synchronously, and runs the pending migrations
(``server.store.migrations``), so a wrong URL or an unreachable server stops start-up with a message. The
pool itself opens on the first call, in the event loop that makes it, and stays bound to that loop.

Order: as in the SQLite store, a ``position`` float per message; append takes ``max + 1``,
``insert_message`` the midpoint of its neighbours, renumbering on the rare day floats run out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.types.json import Json
from psycopg.types.string import StrDumperUnknown
from psycopg_pool import AsyncConnectionPool

from server.errors import ConfigError, SessionExists, StoreUnavailable, UnknownSession
from server.history.messages import ChatMessage
from server.store.base import (
    CALL_FIELDS,
    CallRecord,
    Clock,
    SessionSummary,
    StoredSession,
    call_to_data,
    message_from_data,
    message_to_data,
)
from server.store.migrations import migrate_postgres
from server.store.postgres_users import PostgresUsers
from server.store.search import POSTGRES, SUMMARY, search_sql

Conn = psycopg.AsyncConnection[Any]
Row = tuple[Any, ...]
CONNECT_SECONDS = 10.0  # [store] timeout_seconds: long enough for a failover, short enough to tell

_INSERT_CALL = (f"INSERT INTO calls (session_id, {', '.join(CALL_FIELDS)}) "
                f"VALUES ({', '.join(['%s'] * (len(CALL_FIELDS) + 1))})")
_INSERT = "INSERT INTO messages (session_id, id, position, data) VALUES (%s, %s, %s, %s)"
# A trim or a notice: its fields as JSON, in the table named (``trims``, ``notices``).
_INSERT_EVENT = "INSERT INTO {} (session_id, data, created_at) VALUES (%s, %s, %s)"
_UPSERT = _INSERT + " ON CONFLICT (session_id, id) DO UPDATE SET data = excluded.data"
# A streaming reply's checkpoint once its row exists: the row rewritten in place, the session
# untouched (its final write touches it), no position to find.
_CHECKPOINT = "UPDATE messages SET data = %s WHERE session_id = %s AND id = %s"


class _NulSafeText(StrDumperUnknown):
    """PostgreSQL text cannot hold NUL (SQLite can): a title or id carrying one gets U+FFFD there.
    Message documents keep every character: JSON escapes NUL."""

    def dump(self, obj: str) -> Buffer | None:
        return super().dump(obj.replace("\x00", "\ufffd"))


async def _configure(conn: Conn) -> None:
    conn.adapters.register_dumper(str, _NulSafeText)


def _document(message: ChatMessage) -> tuple[str, Json]:
    """(id, data) of ``message``, built before any await so a streaming reply cannot change under it."""
    data = message_to_data(message)
    return data["id"], Json(data)


def _where(url: str) -> str:
    """The URL without its password, for messages."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return f"PostgreSQL {info.get('host', 'local')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PostgresStore(PostgresUsers):
    """The ``server.store.base.Store`` contract on a PostgreSQL database; build it with ``open_store``."""

    def __init__(self, url: str, pool_size: int, timeout: float = CONNECT_SECONDS) -> None:
        # check: a connection is tested when handed out, so one that a database restart closed is
        # replaced instead of failing the write that drew it.
        self._pool = AsyncConnectionPool(url, min_size=1, max_size=pool_size, open=False,
                                         timeout=timeout, name="meterchat", configure=_configure,
                                         check=AsyncConnectionPool.check_connection)
        self._opened = False
        self._clock = Clock()

    @classmethod
    def open(cls, url: str, pool_size: int = 10, timeout: float = CONNECT_SECONDS) -> PostgresStore:
        try:
            where = _where(url)
        except psycopg.Error as exc:  # its text may quote the URL, password included
            raise ConfigError("store.url: not a valid PostgreSQL URL") from exc
        try:
            with psycopg.connect(url, connect_timeout=max(1, round(timeout))) as conn:
                migrate_postgres(conn, where)
        except psycopg.Error as exc:
            raise ConfigError(f"store.url: cannot open {where}: {exc}") from exc
        return cls(url, pool_size, timeout)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Conn]:
        """One transaction: committed when the block ends, rolled back when it raises. A lost
        server (down, restarting, no connection within ``timeout``) becomes ``StoreUnavailable``."""
        try:
            if not self._opened:
                await self._pool.open()  # not wait=True: a pool that times out there closes for good
                self._opened = True
            async with self._pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg.OperationalError as exc:  # PoolTimeout is one too
            raise StoreUnavailable(f"the session store cannot be reached: {exc}") from exc

    async def _touch(self, conn: Conn, session_id: str) -> str:
        """Stamp the session; its row stays locked until commit, so its writes take turns."""
        now = self._clock.now()
        cursor = await conn.execute("UPDATE sessions SET updated_at = %s WHERE id = %s", (now, session_id))
        if cursor.rowcount == 0:
            raise UnknownSession(f"no session {session_id!r}")
        return now

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()

    # sessions

    async def create_session(self, session_id: str, *, title: str, route: str,
                             owner: str | None = None) -> None:
        async with self._transaction() as conn:
            await self._create(conn, session_id, title, route, None, owner)

    async def _create(self, conn: Conn, session_id: str, title: str, route: str,
                      created_at: str | None, owner: str | None) -> None:
        now = self._clock.now()
        cursor = await conn.execute(
            "INSERT INTO sessions (id, title, route, created_at, updated_at, owner_id) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
            (session_id, title, route, created_at or now, now, owner))
        if cursor.rowcount == 0:  # DO NOTHING: a failed INSERT would poison the transaction
            raise SessionExists(f"session {session_id!r} already exists")

    async def get_session(self, session_id: str) -> StoredSession | None:
        async with self._transaction() as conn:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # one snapshot
            head = await (await conn.execute(
                "SELECT id, title, route, created_at, updated_at, owner_id FROM sessions WHERE id = %s",
                (session_id,))).fetchone()
            if head is None:
                return None
            rows = await (await conn.execute(
                "SELECT data FROM messages WHERE session_id = %s ORDER BY position",
                (session_id,))).fetchall()
            calls = await (await conn.execute(
                f"SELECT {', '.join(CALL_FIELDS)} FROM calls WHERE session_id = %s ORDER BY seq",
                (session_id,))).fetchall()
            trims = await (await conn.execute(
                "SELECT data, created_at FROM trims WHERE session_id = %s ORDER BY seq",
                (session_id,))).fetchall()
            notices = await (await conn.execute(
                "SELECT data, created_at FROM notices WHERE session_id = %s ORDER BY seq",
                (session_id,))).fetchall()
        session_id, title, route, created_at, updated_at, owner = head
        return StoredSession(session_id, title, route, created_at, updated_at,
                             [message_from_data(row[0]) for row in rows], [CallRecord(*row) for row in calls],
                             [{"created_at": at, **data} for data, at in trims],
                             [{"created_at": at, **data} for data, at in notices], owner)

    async def ping(self) -> None:
        await self._query("SELECT 1", ())

    async def get_summary(self, session_id: str) -> SessionSummary | None:
        rows = await self._query(SUMMARY + " WHERE s.id = %s", (session_id,))
        return SessionSummary(*rows[0]) if rows else None

    async def list_sessions(self, query: str = "", before: str | None = None, limit: int | None = None,
                            before_id: str | None = None, owner: str | None = None) -> list[SessionSummary]:
        """Sessions, most recently updated first: all, or those whose title or text matches."""
        rows = await self._query(*search_sql(POSTGRES, query, before, limit, before_id, owner))
        return [SessionSummary(*row) for row in rows]

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[Row]:
        async with self._transaction() as conn:
            return await (await conn.execute(sql, params)).fetchall()

    async def rename_session(self, session_id: str, title: str) -> None:
        await self._set_field(session_id, "UPDATE sessions SET title = %s WHERE id = %s", title)

    async def set_route(self, session_id: str, route: str) -> None:
        await self._set_field(session_id, "UPDATE sessions SET route = %s WHERE id = %s", route)

    async def _set_field(self, session_id: str, sql: str, value: str) -> None:
        async with self._transaction() as conn:
            await self._touch(conn, session_id)
            await conn.execute(sql, (value, session_id))

    async def delete_session(self, session_id: str) -> None:
        """Remove the session with its messages and calls (foreign keys cascade)."""
        async with self._transaction() as conn:
            cursor = await conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
            if cursor.rowcount == 0:
                raise UnknownSession(f"no session {session_id!r}")

    # messages and calls

    async def append_messages(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        documents = [_document(message) for message in messages]
        async with self._transaction() as conn:
            await self._put(conn, session_id, documents, _INSERT)

    async def save_messages(self, session_id: str, messages: Sequence[ChatMessage],
                            calls: Sequence[CallRecord] = ()) -> None:
        documents = [_document(message) for message in messages]
        async with self._transaction() as conn:
            touched = None
            if documents or not calls:
                touched = await self._put(conn, session_id, documents, _UPSERT)
            if calls:
                await self._put_calls(conn, session_id, calls, touched)

    async def save_batch(self, batch: Mapping[str, Sequence[ChatMessage]]) -> None:
        work = [(session_id, [_document(message) for message in messages])
                for session_id, messages in batch.items()]
        async with self._transaction() as conn:
            for session_id, documents in work:
                # A reply's first checkpoint inserts its row; the later ones rewrite it in place.
                new = [document for document in documents
                       if not await self._rewritten(conn, session_id, document)]
                if not new:
                    continue
                try:
                    await self._put(conn, session_id, new, _UPSERT)
                except UnknownSession:  # deleted while it streamed; its UPDATE matched nothing
                    continue

    @staticmethod
    async def _rewritten(conn: Conn, session_id: str, document: tuple[str, Json]) -> bool:
        message_id, data = document
        cursor = await conn.execute(_CHECKPOINT, (data, session_id, message_id))
        return cursor.rowcount == 1

    async def _put(self, conn: Conn, session_id: str, documents: list[tuple[str, Json]], sql: str) -> str:
        """Write ``documents`` at the session's end (an upsert keeps a known id's place); the time
        the session was touched."""
        now = await self._touch(conn, session_id)
        position = await self._next_position(conn, session_id)
        # An upsert of a known id keeps its position, so the unused numbers leave gaps; harmless.
        async with conn.cursor() as cursor:
            await cursor.executemany(sql, [(session_id, message_id, position + offset, data)
                                           for offset, (message_id, data) in enumerate(documents)])
        return now

    async def _next_position(self, conn: Conn, session_id: str) -> float:
        row = await (await conn.execute("SELECT MAX(position) FROM messages WHERE session_id = %s",
                                        (session_id,))).fetchone()
        return 0.0 if row is None or row[0] is None else float(row[0]) + 1.0

    async def insert_message(self, session_id: str, index: int, message: ChatMessage) -> None:
        """Place ``message`` so it becomes the ``index``-th (clamped to the ends) of the session."""
        message_id, data = _document(message)
        async with self._transaction() as conn:
            await self._touch(conn, session_id)
            position = await self._position_for(conn, session_id, max(index, 0))
            if position is None:
                await self._renumber(conn, session_id)
                position = await self._position_for(conn, session_id, max(index, 0))
            await conn.execute(_INSERT, (session_id, message_id, position, data))

    async def _position_for(self, conn: Conn, session_id: str, index: int) -> float | None:
        cursor = await conn.execute(
            "SELECT position FROM messages WHERE session_id = %s ORDER BY position", (session_id,))
        positions = [float(row[0]) for row in await cursor.fetchall()]
        if index >= len(positions):
            return positions[-1] + 1.0 if positions else 0.0
        after = positions[index]
        before = positions[index - 1] if index > 0 else after - 2.0
        middle = (before + after) / 2
        return middle if before < middle < after else None

    async def _renumber(self, conn: Conn, session_id: str) -> None:
        await conn.execute(
            "UPDATE messages m SET position = r.n - 1 FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY position) "
            "AS n FROM messages WHERE session_id = %s) r WHERE m.session_id = %s AND m.id = r.id",
            (session_id, session_id))

    async def record_call(self, session_id: str, call: CallRecord) -> None:
        async with self._transaction() as conn:
            await self._put_calls(conn, session_id, [call])

    async def _put_calls(self, conn: Conn, session_id: str, calls: Sequence[CallRecord],
                         touched: str | None = None) -> None:
        """Record ``calls``; ``touched``: the session was touched in this transaction already (a
        round trip saved per reply)."""
        now = touched or await self._touch(conn, session_id)
        async with conn.cursor() as cursor:
            await cursor.executemany(_INSERT_CALL, [(session_id, *_call_row(call, now)) for call in calls])

    # windows learned from overflow errors

    async def load_windows(self) -> dict[tuple[str, str], int]:
        rows = await self._query("SELECT provider, model, tokens FROM route_windows", ())
        return {(provider, model): tokens for provider, model, tokens in rows}

    async def save_window(self, provider: str, model: str, tokens: int) -> None:
        async with self._transaction() as conn:
            await conn.execute(
                "INSERT INTO route_windows VALUES (%s, %s, %s, %s) ON CONFLICT (provider, model) "
                "DO UPDATE SET tokens = excluded.tokens, learned_at = excluded.learned_at",
                (provider, model, tokens, self._clock.now()))

    async def record_trim(self, session_id: str, trim: Mapping[str, Any],
                          marked: Sequence[ChatMessage] = ()) -> None:
        """Keep a ``history_trimmed`` event (its fields) so a reload shows the notice again, and save
        the messages it marked, in one transaction."""
        documents = [_document(message) for message in marked]
        async with self._transaction() as conn:
            await self._put(conn, session_id, documents, _UPSERT)
            await self._insert_event(conn, "trims", session_id, trim)

    async def record_notice(self, session_id: str, notice: Mapping[str, Any]) -> None:
        """Keep a line of the transcript (an error, a notice, a switch) for a reload."""
        await self._put_event("notices", session_id, notice)

    async def _put_event(self, table: str, session_id: str, data: Mapping[str, Any]) -> None:
        async with self._transaction() as conn:
            await self._insert_event(conn, table, session_id, data)

    async def _insert_event(self, conn: Conn, table: str, session_id: str, data: Mapping[str, Any]) -> None:
        now = await self._touch(conn, session_id)
        await conn.execute(_INSERT_EVENT.format(table), (session_id, Json(dict(data)), now))

    async def import_session(self, session: StoredSession, owner: str | None = None) -> None:
        """Write a whole session (from an export) at once, owned by ``owner``; its id must be new."""
        documents = [_document(message) for message in session.messages]
        async with self._transaction() as conn:
            await self._create(conn, session.id, session.title, session.route, session.created_at, owner)
            await self._put(conn, session.id, documents, _INSERT)
            await self._put_calls(conn, session.id, session.calls)
            async with conn.cursor() as cursor:
                for table, lines in (("trims", session.trims), ("notices", session.notices)):
                    await cursor.executemany(_INSERT_EVENT.format(table), [
                        (session.id, Json(dict(line)), line["created_at"]) for line in lines])


def _call_row(call: CallRecord, now: str) -> Row:
    data = call_to_data(call)
    data["created_at"] = data["created_at"] or now
    return tuple(data[name] for name in CALL_FIELDS)
