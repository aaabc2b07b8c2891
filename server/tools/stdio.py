"""The stdio transport for MCP servers, bounded while it reads.

The SDK's ``stdio_client`` joins a line in memory however long it grows, so one tool that prints a
gigabyte would hold a gigabyte here. This transport speaks the same wire (one JSON-RPC message per
line on the program's stdin and stdout) but keeps at most ``max_line_bytes`` of a line: the rest of
a longer one is read and dropped as it comes, and the request it answered gets a JSON-RPC error
naming its size, found from the message's ``id`` at its start or end (where JSON-RPC libraries
write it). The program runs in its own process group and is stopped with it (stdin closed, then
SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import IO, Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from server.errors import MeterchatError

KEEP = 256  # bytes kept of the start and the end of a dropped line, to find its id
STOP_GRACE_SECONDS = 2.0
RESULT_TOO_LARGE = -32001
_ID_AT_START = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(\d+|"[^"]{0,64}")')
_ID_AT_END = re.compile(rb'"id"\s*:\s*(\d+|"[^"]{0,64}")\s*\}\s*$')


class LineTooLong(MeterchatError):
    """A message from an MCP server over its ``max_result_bytes`` (dropped while read)."""


class BoundedLines:
    """Splits a byte stream into JSON-RPC messages, dropping any line over ``max_line_bytes``."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max = max_line_bytes
        self.buffer = bytearray()
        self.dropping = False
        self.dropped = 0
        self.head = b""
        self.tail = b""

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        while chunk:
            end = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1:])
            self._take(piece)
            if end >= 0:
                out.extend(self._line_done())
        return out

    def _take(self, piece: bytes) -> None:
        if self.dropping:
            self.dropped += len(piece)
            self.tail = (self.tail + piece)[-KEEP:]
            return
        self.buffer += piece
        if len(self.buffer) > self.max:  # the line no longer fits: keep its ends, drop the rest
            self.dropping, self.dropped = True, len(self.buffer)
            self.head, self.tail = bytes(self.buffer[:KEEP]), bytes(self.buffer[-KEEP:])
            self.buffer = bytearray()

    def _line_done(self) -> list[SessionMessage | Exception]:
        if self.dropping:
            answer = self._too_long()
            self.dropping, self.dropped, self.head, self.tail = False, 0, b"", b""
            return [answer]
        line, self.buffer = bytes(self.buffer), bytearray()
        if not line.strip():
            return []
        try:
            return [SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))]
        except ValueError as exc:
            return [exc]

    def _too_long(self) -> SessionMessage | Exception:
        found = _ID_AT_START.search(self.head) or _ID_AT_END.search(self.tail)
        text = (f"the MCP server sent a message of {self.dropped:,} bytes, over max_result_bytes "
                f"({self.max:,}); it was dropped while read")
        if found is None:
            return LineTooLong(text)
        raw = found.group(1).decode()
        request_id: int | str = int(raw) if raw.isdigit() else raw.strip('"')
        error = types.ErrorData(code=RESULT_TOO_LARGE, message=text)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def _errlog() -> IO[Any] | int:
    """The server's stderr goes to ours (an operator sees its complaints) when ours is a real file."""
    try:
        sys.stderr.fileno()
    except (io.UnsupportedOperation, AttributeError, ValueError):
        return subprocess.DEVNULL
    return sys.stderr


@asynccontextmanager
async def bounded_stdio(params: StdioServerParameters, max_line_bytes: int,
                        on_end: Callable[[], object] = lambda: None) -> AsyncIterator[Any]:
    """An MCP transport (read and write streams) to a program started from ``params``; ``on_end``
    is called when the program's stdout ends (it exited or crashed)."""
    process = await anyio.open_process(
        [params.command, *params.args], env=get_default_environment() | (params.env or {}),
        cwd=params.cwd or None, stderr=_errlog(), start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        lines = BoundedLines(max_line_bytes)
        try:
            async with read_writer:
                with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                              OSError):
                    async for chunk in process.stdout:
                        for item in lines.feed(chunk):
                            await read_writer.send(item)
        finally:
            on_end()

    async def write() -> None:
        assert process.stdin is not None
        async with write_reader:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode("utf-8"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await stop(process)
            tasks.cancel_scope.cancel()


async def stop(process: Process) -> None:
    """Close stdin and wait a little, then SIGTERM and SIGKILL the whole process group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with anyio.move_on_after(STOP_GRACE_SECONDS):
            await process.wait()
        if process.returncode is not None:
            break
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    with anyio.move_on_after(STOP_GRACE_SECONDS):
        await process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.aclose()
