"""``WriteGroup``: writes that come while one is on its way leave together, as one.

When 500 replies end within a second, each final write was its own thread hop and its own
transaction, and each committed its own small full-text segment: 1.3 ms of CPU a reply, a third of
the server's core in those seconds. A group takes every write queued while the previous group was
on its way and runs them in one call of ``run`` (one hop, one transaction), each write inside its
own savepoint: a write that raises one of ``own_errors`` (a session deleted meanwhile) is undone
alone and raises to its caller alone; any other error ends the whole group, and every caller in it
gets that error (the transaction was rolled back; each may write again). A caller waits for its
own write whatever happens, as with one hop (a cancelled caller's write still runs its course).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable

import anyio

Write = Callable[[], object]


class _Queued:
    __slots__ = ("write", "error", "done")

    def __init__(self, write: Write) -> None:
        self.write = write
        self.error: BaseException | None = None
        self.done = anyio.Event()


class WriteGroup:
    """Group commit over ``run``, which runs a callable in one transaction off the event loop."""

    def __init__(self, run: Callable[[Callable[[], None]], Awaitable[None]], connection: sqlite3.Connection,
                 own_errors: tuple[type[Exception], ...]) -> None:
        self._run = run
        self._connection = connection
        self._own_errors = own_errors
        self._queued: list[_Queued] = []
        self._flight: anyio.Event | None = None  # set when the group on its way has committed

    async def write(self, write: Write) -> None:
        queued = _Queued(write)
        self._queued.append(queued)
        with anyio.CancelScope(shield=True):
            while not queued.done.is_set():
                if self._flight is None:
                    await self._lead()
                else:
                    await self._flight.wait()
        if queued.error is not None:
            raise queued.error

    async def _lead(self) -> None:
        group, self._queued = self._queued, []
        self._flight = flight = anyio.Event()
        try:
            await self._run(lambda: self._each(group))
        except Exception as exc:  # the transaction failed as a whole: every write in it did
            for queued in group:
                queued.error = queued.error or exc
        finally:
            self._flight = None
            flight.set()
            for queued in group:
                queued.done.set()

    def _each(self, group: list[_Queued]) -> None:
        """In the transaction, on the store's thread: each write in its savepoint."""
        connection = self._connection
        for queued in group:
            connection.execute("SAVEPOINT grouped")
            try:
                queued.write()
            except self._own_errors as exc:
                connection.execute("ROLLBACK TO grouped")
                queued.error = exc
            connection.execute("RELEASE grouped")

