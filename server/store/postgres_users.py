"""``SqlUsers``' two primitives on PostgreSQL (mixed into ``PostgresStore``: the same pool and
transactions as every other call)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from server.store.sql_users import SqlUsers
from server.store.users import dialect_sql

Conn = psycopg.AsyncConnection[Any]


class PostgresUsers(SqlUsers):
    duplicate = psycopg.errors.UniqueViolation

    def _transaction(self) -> AbstractAsyncContextManager[Conn]:
        raise NotImplementedError  # PostgresStore's

    async def _read(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        async with self._transaction() as conn:
            return await (await conn.execute(dialect_sql(statement), params)).fetchall()

    async def _change(self, *steps: tuple[str, tuple[Any, ...]]) -> int:
        """Run ``steps`` in one transaction; the rows the first one changed."""
        counts = []
        async with self._transaction() as conn:
            for statement, params in steps:
                counts.append((await conn.execute(dialect_sql(statement), params)).rowcount)
        return counts[0]
