"""``WriteGroup``: writes that come while one is on its way leave together, as one.

When 500 replies end within a second, each final write was its own thread hop and its own
transaction, and each committed its own small full-text segment: 1.3 ms of CPU a reply, a third of
the server's core in those seconds. A group takes every write queued while the previous group was
on its way and runs them in one call of ``run`` (one hop, one transaction), each write inside its
own savepoint. A write that raises is undone alone and its caller alone gets the error (``errors``
turns it into what the store raises), as long as the transaction stands; an error that ended the
transaction (SQLite rolls back on some, such as a full disk) or came from ``run`` itself fails the
whole group, and every caller in it gets its own copy of that error (each may write again). A caller
already cancelled writes nothing; once its write is queued, it waits for it whatever happens, as it
waited for its thread before.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

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
                 errors: Callable[[Exception], Exception]) -> None:
        self._run = run
        self._connection = connection
        self._errors = errors
        self._queued: list[_Queued] = []
        self._flight: anyio.Event | None = None  # set when the group on its way has ended

    async def write(self, write: Write) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
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
        except BaseException as exc:  # the transaction ended as a whole: every write in it failed
            for queued in group:
                queued.error = queued.error or _own_copy(exc)
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
            except Exception as exc:
                if not connection.in_transaction:
                    raise  # SQLite ended the transaction: the group fails
                connection.execute("ROLLBACK TO grouped")
                queued.error = self._errors(exc)
            connection.execute("RELEASE grouped")


def _own_copy(error: BaseException) -> BaseException:
    """A copy of a group's error for one caller (raised in many tasks, one object would collect all
    their tracebacks), caused by the original."""
    try:
        mine = copy.copy(error)
    except Exception:  # an error that cannot be copied: the original, shared
        return error
    mine.__cause__, mine.__traceback__ = error, None
    return mine
