"""The MCP client against real servers started by the tests: both transports, every content kind,
and the faults (missing, hanging, crashing, flooding, 500 tools), each answered as a tool error."""

from __future__ import annotations

import json
import logging
import re
import sys
import tomllib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from server.config.load import settings_from_mapping
from server.providers.base import ToolSpec
from server.tools.catalog import schema_bytes
from server.tools.results import ToolOutput
from server.tools.toolbox import Toolbox
from tests.mcp_support import REPO, everything_http, everything_stdio, faulty_server, time_server

pytestmark = pytest.mark.anyio
OPENAI = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


@asynccontextmanager
async def toolbox(servers: Mapping[str, Any],
                  **profile: Any) -> AsyncIterator[tuple[Toolbox, list[ToolSpec]]]:
    settings = settings_from_mapping({"mcp_servers": servers, "providers": {"p": {**OPENAI, **profile}}},
                                     env={})
    box = Toolbox(settings.mcp_servers, 1024 * 1024)
    async with anyio.create_task_group() as tasks:
        await box.start(tasks)
        yield box, box.specs(settings.providers["p"])
        tasks.cancel_scope.cancel()


async def run(box: Toolbox, specs: list[ToolSpec], name: str, **arguments: Any) -> ToolOutput:
    return await box.run(name, arguments, specs)


async def test_time_server_over_stdio_lists_and_answers():
    async with toolbox({"time": time_server()}) as (box, specs):
        assert [s.name for s in specs] == ["time__get_current_time", "time__convert_time"]
        output = await run(box, specs, "time__get_current_time", timezone="Asia/Tokyo")
        bad = await run(box, specs, "time__get_current_time", timezone="Nowhere/Atlantis")
    assert not output.is_error and json.loads(output.text)["timezone"] == "Asia/Tokyo"
    assert bad.is_error and bad.text.startswith("error: ") and "Nowhere/Atlantis" in bad.text


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_everything_server_content_kinds(transport):
    if transport == "http":
        with everything_http() as url:
            await _content_kinds({"url": url})
    else:
        await _content_kinds(everything_stdio())


async def _content_kinds(server: dict[str, Any]) -> None:
    async with toolbox({"ev": server}) as (box, specs):
        assert {"ev__echo", "ev__get-tiny-image", "ev__get-structured-content"} <= {s.name for s in specs}
        echo = await run(box, specs, "ev__echo", message="hello ✓")
        image = await run(box, specs, "ev__get-tiny-image")
        structured = await run(box, specs, "ev__get-structured-content", location="New York")
        resource = await run(box, specs, "ev__get-resource-reference", resourceType="Text", resourceId=1)
    assert echo == ToolOutput("Echo: hello ✓")
    assert len(image.images) == 1 and image.images[0].media_type == "image/png"
    assert "[image: image/png," in image.text
    assert set(json.loads(structured.text)) >= {"temperature", "conditions"}
    assert "[resource demo://resource/dynamic/text/1]" in resource.text
    assert "plaintext resource" in resource.text


async def test_only_selected_servers_and_tools_are_offered():
    servers = {"time": time_server(), "ev": everything_stdio()}
    async with toolbox(servers, tools=["time/convert_time", "ev"]) as (box, specs):
        names = [s.name for s in specs]
        refused = await run(box, specs, "time__get_current_time", timezone="UTC")
    assert "time__convert_time" in names and "time__get_current_time" not in names and "ev__echo" in names
    assert "lookup_document" not in names  # the demo's lookup stays with the demo provider
    assert refused.is_error and "unknown tool 'time__get_current_time'" in refused.text


async def test_missing_server_is_one_line_and_the_rest_start(caplog):
    caplog.set_level(logging.WARNING)
    servers = {"gone": {"command": "meterchat-no-such-mcp-server"}, "time": time_server()}
    async with toolbox(servers) as (box, specs):
        output = await run(box, specs, "gone__anything")
        names = [s.name for s in specs]
    lines = [r.getMessage() for r in caplog.records if "gone" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("MCP server gone is missing at start-up")
    assert names == ["time__get_current_time", "time__convert_time"]
    assert output.is_error


async def test_a_server_whose_tools_change_is_listed_again():
    # The SDK's server speaks the 2026-07-28 protocol: the change comes on a subscriptions/listen
    # stream (a bare notification is not delivered at that protocol).
    async with toolbox({"f": faulty_server()}) as (box, specs):
        profile = settings_from_mapping({"providers": {"p": OPENAI}}, env={}).providers["p"]
        assert "f__extra_1" not in [s.name for s in specs]
        assert (await run(box, specs, "f__grow", way="listen")).text == "extra_1"
        with anyio.fail_after(5):  # until the changed list is read (a listing round trip)
            while "f__extra_1" not in [s.name for s in box.specs(profile)]:
                await anyio.sleep(0.01)
        output = await run(box, box.specs(profile), "f__extra_1")
    assert not output.is_error and output.text == "extra_1"


async def test_an_older_servers_notification_of_changed_tools_is_listed_again(caplog):
    # server-everything speaks the 2025-11-25 protocol and registers the tools that depend on the
    # client's capabilities once it is initialized: it says so with notifications/tools/list_changed.
    caplog.set_level(logging.INFO, logger="server.tools.connection")
    async with toolbox({"ev": everything_stdio()}) as (box, _specs):
        with anyio.fail_after(10):
            while not any("MCP server ev: its tools changed" in r.getMessage() for r in caplog.records):
                await anyio.sleep(0.01)
        profile = settings_from_mapping({"providers": {"p": OPENAI}}, env={}).providers["p"]
        assert "ev__simulate-research-query" in [s.name for s in box.specs(profile)]


async def test_hanging_call_ends_at_the_call_timeout_and_the_server_goes_on():
    async with toolbox({"f": faulty_server(call_timeout_seconds=0.5)}) as (box, specs):
        hung = await run(box, specs, "f__hang")
        after = await run(box, specs, "f__ping")
    assert hung.is_error and "did not answer within call_timeout_seconds (0.5 s)" in hung.text
    assert after == ToolOutput("pong")


async def test_crash_mid_call_is_an_error_and_the_server_restarts(tmp_path):
    marker = tmp_path / "starts"
    async with toolbox({"f": faulty_server("--marker", str(marker))}) as (box, specs):
        crashed = await run(box, specs, "f__crash")
        with anyio.fail_after(20):
            await box.connections["f"].wait_ready()
        after = await run(box, specs, "f__ping")
    assert crashed.is_error and "f/crash failed" in crashed.text
    assert after == ToolOutput("pong")
    assert len(marker.read_text().split()) == 2  # started, crashed, started again


async def test_flood_is_dropped_while_read_and_the_connection_stays():
    async with toolbox({"f": faulty_server(max_result_bytes=64 * 1024)}) as (box, specs):
        flood = await run(box, specs, "f__flood", size=8 * 1024 * 1024)
        after = await run(box, specs, "f__ping")
    assert flood.is_error and "over max_result_bytes (65,536)" in flood.text
    assert "dropped while read" in flood.text
    assert after == ToolOutput("pong")


async def test_flood_over_http_is_dropped_while_read():
    with everything_http() as url:
        async with toolbox({"ev": {"url": url, "max_result_bytes": 20_000}}) as (box, specs):
            flood = await run(box, specs, "ev__echo", message="y" * 50_000)
            after = await run(box, specs, "ev__echo", message="short")
    assert flood.is_error and "exceeded the 20000 byte limit" in flood.text
    assert after == ToolOutput("Echo: short")


async def test_five_hundred_tools_are_bounded(caplog):
    caplog.set_level(logging.WARNING)
    server = faulty_server("--tools", "500", max_tools=100, max_schema_bytes=40_000)
    async with toolbox({"f": server}) as (box, specs):
        pass
    assert 0 < len(specs) <= 100
    assert sum(schema_bytes(s) for s in specs) <= 40_000
    left_out = [r.getMessage() for r in caplog.records if "tools left out" in r.getMessage()]
    assert len(left_out) == 1 and left_out[0].startswith(f"MCP server f: {505 - len(specs)} tools left out")


async def test_readme_tools_example_starts_the_time_server():
    """The README's three lines, with the command found where pip put it (this environment's bin)."""
    readme = (REPO / "README.md").read_text()
    example = next(block for block in re.findall(r"```toml\n(.*?)```", readme, flags=re.S)
                   if "[mcp_servers.time]" in block)
    table = tomllib.loads(example)["mcp_servers"]["time"]
    installed = Path(sys.executable).parent / table["command"]
    async with toolbox({"time": {**table, "command": str(installed)}}) as (box, specs):
        output = await run(box, specs, "time__get_current_time", timezone="Asia/Tokyo")
    assert json.loads(output.text)["timezone"] == "Asia/Tokyo"
