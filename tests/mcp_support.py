"""The real MCP servers the tests start: ``mcp-server-time`` (PyPI, stdio), the reference
``@modelcontextprotocol/server-everything`` (npm, installed by scripts/test into tests/.mcp, stdio or
Streamable HTTP) and tests/fakes/mcp_faulty.py (the SDK's own server, misbehaving on purpose)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
NODE_FOLDER = REPO / "tests" / ".mcp"
EVERYTHING = NODE_FOLDER / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
_LISTENING = re.compile(r"LISTENING (\d+)")


def time_server(**extra: Any) -> dict[str, Any]:
    """``[mcp_servers.time]``: the PyPI time server, started by meterchat over stdio."""
    return {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            **extra}


def faulty_server(*args: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_faulty", *args], "cwd": str(REPO),
            **extra}


def everything_stdio(**extra: Any) -> dict[str, Any]:
    if not EVERYTHING.exists():
        pytest.fail("server-everything is not installed: run scripts/test (npm ci --prefix tests/.mcp)")
    return {"command": "node", "args": [str(EVERYTHING), "stdio"], **extra}


@contextmanager
def everything_http() -> Iterator[str]:
    """server-everything in Streamable HTTP mode on 127.0.0.1, a free port; yields its /mcp URL."""
    everything_stdio()  # the same install check
    process = subprocess.Popen(
        ["node", "--require", str(NODE_FOLDER / "loopback.cjs"), str(EVERYTHING), "streamableHttp"],
        env={"PATH": os.environ.get("PATH", ""), "PORT": "0"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:  # waits for the server's own word, no timer
            found = _LISTENING.search(line)
            if found:
                break
        else:
            pytest.fail(f"server-everything exited before listening (code {process.wait()})")
        # its log goes on: read it away, or a full pipe would stop the server
        drain = threading.Thread(target=process.stderr.read, daemon=True)
        drain.start()
        yield f"http://127.0.0.1:{found.group(1)}/mcp"
    finally:
        drain = locals().get("drain")
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain is not None:
            drain.join(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
