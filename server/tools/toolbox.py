"""The tools of one process: its MCP connections and the demo's built-in lookup.

``Toolbox.start`` starts one supervised connection per enabled ``[mcp_servers]`` server in the app's
task group and waits (each at most its ``start_timeout_seconds``, all at once) for their first
listing; a server that is missing then is logged in one line naming it, the server starts without
it, and its supervisor keeps trying with backoff. Every worker process has its own connections (a
stdio server runs once per process).

``offered(profile)`` is what a provider's calls carry: the MCP tools its ``tools`` setting selects
from the servers ready now, plus the built-in lookup for a ``demo`` provider only. ``run`` runs a
call by the model-facing name and never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup

from server.config.settings import McpServerSettings, ProviderProfile
from server.providers.base import ToolSpec
from server.tools import demo
from server.tools.catalog import McpTool, selected
from server.tools.connection import McpConnection
from server.tools.results import ToolOutput, tool_error

log = logging.getLogger(__name__)

BUILTIN = "built-in"  # the server name the page and the meter show for the demo's lookup
SCHEMA_MEMO_ENTRIES = 64
BUILTIN_TOOLS = [McpTool(BUILTIN, spec.name, spec, "never") for spec in demo.tool_specs()]


class Toolbox:
    def __init__(self, servers: Mapping[str, McpServerSettings], max_image_bytes: int) -> None:
        self.connections = {name: McpConnection(s, max_image_bytes)
                            for name, s in servers.items() if s.enabled}
        self._index: dict[str, McpTool] = {}
        self._indexed: tuple[list[McpTool], ...] | None = None  # the listings the index was built from
        self._schemas: dict[tuple[int, ...], tuple[Sequence[ToolSpec], Any]] = {}

    async def start(self, tasks: TaskGroup) -> None:
        for connection in self.connections.values():
            tasks.start_soon(connection.supervise, name=f"mcp server {connection.name}")
        async with anyio.create_task_group() as waits:
            for connection in self.connections.values():
                waits.start_soon(connection.first_outcome.wait)
        for connection in self.connections.values():
            if not connection.ready:
                log.error("MCP server %s is missing at start-up (%s): starting without its tools",
                          connection.name, connection.error)

    def offered(self, profile: ProviderProfile) -> list[McpTool]:
        if profile.tools is False:
            return []
        ready = [tool for c in self.connections.values() if c.ready for tool in c.tools]
        builtin = BUILTIN_TOOLS if profile.kind == "demo" and profile.tools is True else []
        return builtin + selected(ready, profile.tools)

    def specs(self, profile: ProviderProfile) -> list[ToolSpec]:
        return [tool.spec for tool in self.offered(profile)]

    def find(self, name: str) -> McpTool | None:
        """The tool offered as ``name`` (an index rebuilt only when a server's listing changed:
        the meter asks for every offered tool on every reading)."""
        listings = tuple(c.tools for c in self.connections.values())
        if self._indexed is None or any(now is not then for now, then in zip(listings, self._indexed,
                                                                              strict=True)):
            self._index = {t.spec.name: t for c in self.connections.values() for t in c.tools}
            self._index.update((t.spec.name, t) for t in BUILTIN_TOOLS)
            self._indexed = listings
        return self._index.get(name)

    def memo(self, tools: Sequence[ToolSpec], compute: Callable[[Sequence[ToolSpec]], Any]) -> Any:
        """``compute(tools)`` once per list of the same specs (the meter's schema sizes: a JSON dump
        of every offered schema on every reading otherwise). The entry holds the specs, so their
        ids, the key, cannot be reused while it is kept."""
        key = tuple(id(spec) for spec in tools)
        hit = self._schemas.get(key)
        if hit is None:
            if len(self._schemas) >= SCHEMA_MEMO_ENTRIES:
                self._schemas.clear()
            hit = self._schemas[key] = (tuple(tools), compute(tools))
        return hit[1]

    def resolve(self, name: str, offered: Sequence[ToolSpec]) -> McpTool | None:
        """The tool a call names, when it is among those ``offered`` (a model may name any)."""
        return self.find(name) if any(spec.name == name for spec in offered) else None

    def unavailable(self, profile: ProviderProfile) -> list[str]:
        """Servers ``profile`` would be offered that are not ready now (for the page's notice)."""
        if profile.tools is False:
            return []
        wanted = None if profile.tools is True else {item.split("/", 1)[0] for item in profile.tools}
        return [name for name, c in self.connections.items()
                if not c.ready and (wanted is None or name in wanted)]

    async def run(self, name: str, arguments: dict[str, Any], offered: Sequence[ToolSpec]) -> ToolOutput:
        """Run the call ``name`` (a model-facing name among ``offered``) with ``arguments``."""
        tool = self.resolve(name, offered)
        if tool is None:
            known = ", ".join(spec.name for spec in offered) or "none"
            return tool_error(f"unknown tool {name!r}; the tools offered are: {known}")
        if tool.server == BUILTIN:
            return ToolOutput(await demo.run_tool(tool.tool, arguments))
        connection = self.connections.get(tool.server)
        if connection is None:
            return tool_error(f"the MCP server {tool.server} is not configured")
        return await connection.call(tool.tool, arguments)
