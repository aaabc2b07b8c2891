"""The tools ``bench/meter.py`` offers its provider, as a real MCP server (the official SDK, stdio):
``lookup_document`` (the demo's long prose document) and ``query_records`` (a JSON result, as an API
returns one). Since tools reach non-demo providers only through MCP servers, the bench starts this
one as ``[mcp_servers.bench]``.

    python bench/loadkit/meter_tools.py      (meterchat starts it; it speaks MCP on stdin/stdout)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.tools import demo  # noqa: E402


def records(limit: int) -> str:
    rows = [{"id": n, "name": f"record-{n}", "score": round(n / 7, 3), "tags": ["a", "b"][: n % 3],
             "active": n % 2 == 0} for n in range(limit)]
    return json.dumps({"records": rows, "next": None})


def build() -> MCPServer:
    server = MCPServer("bench")

    @server.tool()
    async def lookup_document(title: str) -> str:
        """Look up a document by its title; returns its text."""
        return await demo.lookup_document({"title": title})

    @server.tool()
    def query_records(limit: int = 40) -> str:
        """Query the records table; returns JSON."""
        return records(limit)

    return server


if __name__ == "__main__":
    build().run("stdio")
