"""``SqlUsers``' two primitives on the SQLite file (mixed into ``SqliteStore``: the same
connection, lock and worker thread as every other call)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from server.store.sql_users import SqlUsers

T = TypeVar("T")


class SqliteUsers(SqlUsers):
    duplicate = sqlite3.IntegrityError
    _conn: sqlite3.Connection

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError  # SqliteStore's

    def _write(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError  # SqliteStore's

    def _rows(self, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._conn.execute(statement, params).fetchall()

    async def _read(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        return await self._call(self._rows, statement, params)

    async def _change(self, *steps: tuple[str, tuple[Any, ...]]) -> int:
        """Run ``steps`` in one transaction; the rows the first one changed."""
        return await self._call(self._write, self._steps, steps)

    def _steps(self, steps: tuple[tuple[str, tuple[Any, ...]], ...]) -> int:
        counts = [self._conn.execute(statement, params).rowcount for statement, params in steps]
        return counts[0]
