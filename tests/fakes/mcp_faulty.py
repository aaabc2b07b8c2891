"""An MCP server (the official SDK's ``MCPServer``, stdio) whose tools misbehave on purpose, for the
faults no well-behaved server shows: ``flood`` (a result of N bytes), ``hang`` (never answers),
``crash`` (the process exits mid-call). ``--tools N`` lists N extra tools with long schemas.
``grow`` adds a tool ``extra_N`` and says the tool list changed, both ways the protocol has: a
``subscriptions/listen`` event (2026-07-28) and ``notifications/tools/list_changed`` (before).

Run as ``python -m tests.fakes.mcp_faulty [--tools N] [--marker FILE]``; with ``--marker`` each start
appends a line to FILE (a test counts restarts on it).
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer


def build(extra_tools: int) -> MCPServer:
    server = MCPServer("faulty")

    @server.tool()
    def flood(size: int) -> str:
        """Return a text result of ``size`` bytes."""
        return "x" * size

    @server.tool()
    async def hang() -> str:
        """Never answer."""
        await anyio.sleep_forever()
        return ""

    @server.tool()
    def crash() -> str:
        """Exit the process mid-call."""
        os._exit(3)

    @server.tool()
    def ping() -> str:
        """Answer pong."""
        return "pong"

    grown: list[str] = []

    @server.tool()
    async def grow(ctx: Context, way: str = "both") -> str:
        """Add one more tool and say the tool list changed: on a listen stream, by a notification, or both."""
        name = f"extra_{len(grown) + 1}"
        grown.append(name)
        server.add_tool(lambda: name, name=name, description="A tool added while the server ran.")
        if way in ("listen", "both"):
            await ctx.notify_tools_changed()
        if way in ("notification", "both"):
            await ctx.request_context.session.send_tool_list_changed()
        return name

    for n in range(extra_tools):
        def make(n: int):  # a closure per tool: each its own name
            def tool(query: str) -> str:
                return f"tool {n}: {query}"
            return tool
        server.add_tool(make(n), name=f"bulk_{n:03d}", description="A bulk tool. " + "Padding text. " * 20)
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=0)
    parser.add_argument("--marker", default="")
    args = parser.parse_args()
    if args.marker:
        with open(args.marker, "a") as marker:
            marker.write(f"{os.getpid()}\n")
    build(args.tools).run("stdio")


if __name__ == "__main__":
    sys.exit(main())
