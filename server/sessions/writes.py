"""``Writes``: a session's store writes that run off the turn's path, in the background.

The user's message and a trim's record are written beside the provider call, not before it. While a
turn holds them (``hold``, when its message is accepted) they wait until its first chunk is out
(``release``) or ``HOLD_SECONDS`` have passed, whichever comes first: on a busy core a worker
thread's SQLite work would otherwise run while the provider's answer waits to be read, and the
first chunk would pay for it. A write the store refused is raised by ``check`` when the turn ends,
after every write under way (held ones started then) has ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import anyio
import sniffio
from anyio.abc import TaskGroup

from server.errors import MeterchatError, StoreUnavailable

log = logging.getLogger(__name__)

Write = Callable[[], Awaitable[None]]

# The longest a held write waits for the turn's first chunk, hence the longest an accepted message
# is in memory only before its write starts. A provider slower than this leaves the core idle while
# it thinks, so writes started then cost the first chunk nothing.
HOLD_SECONDS = 0.05


class Writes:
    def __init__(self, session_id: str, tasks: TaskGroup) -> None:
        self.session_id = session_id
        self._tasks = tasks
        self.refused: StoreUnavailable | None = None  # a write the store refused, until ``check``
        self._running = 0  # writes started or held, not yet ended
        self._ended: anyio.Event | None = None  # set when the last of them ended
        self._hold: asyncio.TimerHandle | None = None  # while held: ``release`` at the latest
        self._held: list[Write] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # get_running_loop() is a system call

    def start(self, write: Write) -> None:
        """Run ``write`` in the background (once released, while a turn holds the writes)."""
        if not self._running:
            self._ended = anyio.Event()
        self._running += 1
        if self._hold is not None:
            self._held.append(write)
        else:
            self._tasks.start_soon(self._guarded, write)

    def hold(self) -> None:
        """Writes from now on wait for ``release``, at most ``HOLD_SECONDS``. A timer, not a task:
        nothing more runs before the provider call."""
        if self._hold is None:
            loop = self._loop = self._loop or asyncio.get_running_loop()
            self._hold = loop.call_later(HOLD_SECONDS, self._expired)

    def release(self) -> None:
        """Start the held writes, one after another in the order they were asked for (the user's
        message first): the turn's first chunk is out, the turn ends, or the time ran out."""
        hold, self._hold = self._hold, None
        if hold is None:
            return
        hold.cancel()
        held, self._held = self._held, []
        if held:
            self._tasks.start_soon(self._write_all, held)

    def _expired(self) -> None:
        # A timer's callback runs outside any task, where sniffio (which anyio asks) cannot tell
        # which event loop runs: it is asyncio's, whose timer this is.
        sniffio.current_async_library_cvar.set("asyncio")
        self.release()

    async def check(self) -> None:
        """Wait for every write (held ones started now), then raise a refusal among them."""
        self.release()
        while self._running and self._ended is not None:
            await self._ended.wait()
        refused, self.refused = self.refused, None
        if refused is not None:
            raise refused

    async def _write_all(self, held: list[Write]) -> None:
        for write in held:
            await self._guarded(write)

    async def _guarded(self, write: Write) -> None:
        try:
            await write()
        except StoreUnavailable as exc:
            self.refused = self.refused or exc
        except MeterchatError as exc:  # the session was deleted meanwhile: nothing left to write
            log.warning("a store write of session %s failed: %s", self.session_id, exc.message)
        except Exception:  # a background write must never take the server down
            log.exception("a store write of session %s failed", self.session_id)
        finally:
            self._running -= 1
            if not self._running and self._ended is not None:
                self._ended.set()
