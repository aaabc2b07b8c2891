"""One supervised connection to one MCP server, per process.

``supervise`` runs for the life of the server (in the app's task group): it starts the server (or
reaches it), lists its tools within ``start_timeout_seconds``, then holds the connection until it
breaks: the program exits, its stdout closes, or a call fails because the connection is gone.
While it holds, a server that says its tool list changed (``notifications/tools/list_changed``, or
an event on a ``subscriptions/listen`` stream for servers of the 2026-07-28 protocol) is listed
again, and the next call of every turn is offered the new list (a failed listing keeps the old).
Then it connects again after a backoff (1 s doubling to 60 s, reset by a good start). ``call``
never raises: an unreachable server, a timeout (``call_timeout_seconds``), a result too large or a
protocol failure each come back as a tool error for the model, and the turn goes on.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.exceptions import MCPError

from server.config.settings import McpServerSettings
from server.tools.catalog import McpTool, bounded_tools
from server.tools.http import http_transport
from server.tools.results import ToolOutput, from_result, tool_error
from server.tools.stdio import bounded_stdio

log = logging.getLogger(__name__)

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
MAX_LIST_PAGES = 32  # a server whose cursor never ends cannot hold the start
CLIENT_INFO = types.Implementation(name="meterchat", version="1")


class McpConnection:
    def __init__(self, settings: McpServerSettings, max_image_bytes: int) -> None:
        self.settings = settings
        self.max_image_bytes = max_image_bytes
        self.tools: list[McpTool] = []
        self.client: Client | None = None
        self.error = "not started yet"  # why the server is not ready ("" when it is)
        self.first_outcome = anyio.Event()  # set once the first start succeeded or failed
        self._broken = anyio.Event()
        self._ready = anyio.Event()
        self._changed = anyio.Event()  # the server said its tool list changed since it was listed

    async def wait_ready(self) -> None:
        """Return once the server is ready (at once when it is)."""
        await self._ready.wait()

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def ready(self) -> bool:
        return self.client is not None

    async def supervise(self) -> None:
        delay = BACKOFF_FIRST_SECONDS
        while True:
            started = await self._connect_once()
            if started:
                delay = BACKOFF_FIRST_SECONDS
            # One line when a ready server goes down; a server that stays down (the toolbox named it
            # at start-up) is retried quietly.
            log.log(logging.WARNING if started else logging.DEBUG,
                    "MCP server %s is unavailable (%s); trying again in %.0f s", self.name, self.error, delay)
            self.first_outcome.set()
            await anyio.sleep(delay)
            delay = BACKOFF_FIRST_SECONDS if started else min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _connect_once(self) -> bool:
        """Connect, list, hold until broken. True when the server was ready at some point."""
        self._broken = anyio.Event()
        started = False
        with anyio.CancelScope(deadline=anyio.current_time() + self.settings.start_timeout_seconds) as scope:
            try:
                async with Client(self._transport(), client_info=CLIENT_INFO, cache=None,
                                  message_handler=self._on_message) as client:
                    self._changed = anyio.Event()  # a change said from now on is listed again
                    self.tools = await self._list(client)
                    scope.deadline = math.inf
                    self.client, self.error, started = client, "", True
                    self._ready.set()
                    self.first_outcome.set()
                    log.info("MCP server %s: %d tools", self.name, len(self.tools))
                    async with anyio.create_task_group() as following:
                        following.start_soon(self._follow, client)
                        await self._broken.wait()
                        following.cancel_scope.cancel()
                    self.error = "the connection broke"
            except Exception as exc:  # a server's failure, whatever its shape, only takes down its tools
                self.error = describe(exc)
        if scope.cancelled_caught and not started:
            self.error = f"no answer within start_timeout_seconds ({self.settings.start_timeout_seconds:g} s)"
        self.client, self.tools = None, []
        if self._ready.is_set():
            self._ready = anyio.Event()
        return started

    def _transport(self) -> Any:
        s = self.settings
        if s.url:
            return http_transport(s)
        params = StdioServerParameters(command=s.command, args=s.args, env=s.env or None, cwd=s.cwd or None)
        return bounded_stdio(params, s.max_result_bytes, on_end=self._break)

    async def _list(self, client: Client) -> list[McpTool]:
        listed: list[tuple[str, str | None, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed += [(tool.name, tool.description, tool.input_schema) for tool in page.tools]
            cursor = page.next_cursor
            if cursor is None or len(listed) > self.settings.max_tools:
                break
        return bounded_tools(self.settings, listed)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()

    async def _follow(self, client: Client) -> None:
        """List the tools again each time the server says they changed (changes that come while a
        listing runs make one more listing after it)."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._listen, client)
            while True:
                await self._changed.wait()
                self._changed = anyio.Event()
                try:
                    with anyio.fail_after(self.settings.start_timeout_seconds):
                        self.tools = await self._list(client)
                    log.info("MCP server %s: its tools changed, %d now", self.name, len(self.tools))
                except Exception as exc:  # the old list stays; a broken connection is found by a call
                    log.warning("MCP server %s: listing its changed tools failed: %s", self.name,
                                describe(exc))

    async def _listen(self, client: Client) -> None:
        """A server of the 2026-07-28 protocol tells its changes on a stream the client opens."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                self._changed.set()  # no replay: a change between the listing and the stream is read now
                async for _event in subscription:
                    self._changed.set()
        except ListenNotSupportedError:
            return  # an older server sends notifications/tools/list_changed (``_on_message``)
        except Exception as exc:
            log.info("MCP server %s: no stream of changes (%s)", self.name, describe(exc))

    def _break(self) -> None:
        """The connection is gone: not ready from now on, and the supervisor connects again."""
        self.client = None
        if self._ready.is_set():
            self._ready = anyio.Event()
        self._broken.set()

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        client = self.client
        if client is None:
            return tool_error(f"the MCP server {self.name} is unavailable ({self.error or 'reconnecting'})")
        timeout = self.settings.call_timeout_seconds
        try:
            with anyio.fail_after(timeout):
                result = await client.call_tool(tool, arguments)
        except TimeoutError:
            return tool_error(f"{self.name}/{tool} did not answer within call_timeout_seconds "
                              f"({timeout:g} s)")
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED and not self.settings.url:
                self._break()  # stdio: the program is gone (over HTTP only this request's stream was)
            return tool_error(f"{self.name}/{tool} failed: {exc.error.message}")
        except Exception as exc:  # a broken transport: the model is told, the server restarts
            log.warning("MCP server %s: call of %s failed: %s", self.name, tool, describe(exc))
            self._break()
            return tool_error(f"{self.name}/{tool} failed: {describe(exc)}")
        return from_result(result, self.max_image_bytes)


def describe(exc: BaseException) -> str:
    """One line for an exception (the innermost of an exception group, where the cause is)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
