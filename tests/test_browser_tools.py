"""MCP tool calls in the page, in Debian's chromium: the call with its server and arguments, a
spinner while it runs, the result collapsed with its size in tokens, and the meter's tool schemas
split by server. The model is a fake OpenAI-compatible provider (a real HTTP server) that asks for
the calls; the tools are real MCP servers (mcp-server-time, tests/fakes/mcp_faulty.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.browser_support import open_new_chat, opened_page, received, running_server, send, write_config
from tests.fakes import Call, Reply
from tests.mcp_support import REPO

pytestmark = pytest.mark.browser


def tools_config(folder: Path, base_url: str, servers: str) -> Path:
    provider = f"""
[providers.fake]
kind = "openai"
base_url = "{base_url}"
model = "m1"
discover_window = false
context_window = 32000
"""
    config = write_config(folder, providers=provider + servers)
    text = config.read_text().replace("[server]", 'default_route = "fake"\n\n[server]', 1)
    config.write_text(text)
    return config


TIME = f"""
[mcp_servers.time]
command = {json.dumps(sys.executable)}
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
"""
FAULTY = f"""
[mcp_servers.f]
command = {json.dumps(sys.executable)}
args = ["-m", "tests.fakes.mcp_faulty"]
cwd = {json.dumps(str(REPO))}
call_timeout_seconds = 3
"""


def test_tool_call_shows_server_arguments_and_result_size(browser: Browser, tmp_path, fake_openai) -> None:
    fake_openai.enqueue(Reply(tool_calls=[Call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "c1")]),
                        Reply(text=["It is evening in Tokyo."]))
    with running_server(tools_config(tmp_path, fake_openai.base_url, TIME)) as base, \
            opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "what time is it in Tokyo?")
        tool = page.locator("details.tool").first
        expect(tool).to_have_attribute("data-state", "done")
        expect(page.locator(".msg-row.assistant").last).to_contain_text("It is evening in Tokyo.")
        result = received(page, "tool_result")[0]
        expect(tool.locator("summary")).to_contain_text("time__get_current_time")
        expect(tool.get_by_test_id("tool-server")).to_have_text(" on time")
        expect(tool.get_by_test_id("tool-size")).to_have_text(f" · {result['tokens']:,} tokens")
        expect(tool.get_by_test_id("tool-output")).to_be_hidden()  # collapsed until opened
        tool.locator("summary").click()
        expect(tool.get_by_test_id("tool-args")).to_contain_text('"timezone": "Asia/Tokyo"')
        expect(tool.get_by_test_id("tool-output")).to_contain_text('"timezone": "Asia/Tokyo"')

        page.get_by_test_id("meter-toggle").click()
        schemas = received(page, "context")[-1]["tool_schema_tokens"]
        expect(page.get_by_test_id("breakdown-tool-schema-tokens")).to_have_text(
            f"{schemas:,} tokens (time {schemas:,})")

        page.reload()  # a reload draws the call, its server and its size again
        tool = page.locator("details.tool").first
        expect(tool).to_have_attribute("data-state", "done")
        expect(tool.get_by_test_id("tool-server")).to_have_text(" on time")
        expect(tool.get_by_test_id("tool-size")).to_have_text(f" · {result['tokens']:,} tokens")


def test_running_call_spins_and_a_hang_ends_as_an_error(browser: Browser, tmp_path, fake_openai) -> None:
    fake_openai.enqueue(Reply(tool_calls=[Call("f__hang", {}, "h1")]), Reply(text=["It hung."]))
    with running_server(tools_config(tmp_path, fake_openai.base_url, FAULTY)) as base, \
            opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "hang please")
        tool = page.locator("details.tool").first
        expect(tool.get_by_test_id("tool-spinner")).to_be_visible()
        expect(tool).to_have_attribute("data-state", "running")
        expect(tool).to_have_attribute("data-state", "error", timeout=15_000)
        expect(tool.get_by_test_id("tool-spinner")).to_have_count(0)
        expect(tool.get_by_test_id("tool-size")).to_contain_text("error")
        expect(page.locator(".msg-row.assistant").last).to_contain_text("It hung.")


APPROVED_TIME = TIME + 'approve = "always"\n'


def test_approval_asks_allows_once_and_survives_a_reload(browser: Browser, tmp_path, fake_openai) -> None:
    tokyo = Call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "a1")
    fake_openai.enqueue(Reply(tool_calls=[tokyo]), Reply(text=["Evening in Tokyo."]),
                        Reply(tool_calls=[Call("time__get_current_time", {"timezone": "UTC"}, "a2")]),
                        Reply(text=["I was not allowed."]))
    with running_server(tools_config(tmp_path, fake_openai.base_url, APPROVED_TIME)) as base, \
            opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "what time is it in Tokyo?")
        asking = page.get_by_test_id("tool-approval")
        expect(asking).to_contain_text("Run time__get_current_time on time with these arguments?")
        expect(page.locator("details.tool").first.get_by_test_id("tool-args")).to_contain_text("Asia/Tokyo")
        page.get_by_test_id("tool-allow").click()
        expect(page.locator(".msg-row.assistant").last).to_contain_text("Evening in Tokyo.")
        expect(page.locator("details.tool").first).to_have_attribute("data-state", "done")
        expect(asking).to_have_count(0)

        send(page, "and in UTC?")
        expect(page.get_by_test_id("tool-approval")).to_be_visible()
        page.reload()  # the question is asked again after a reload
        expect(page.get_by_test_id("tool-approval")).to_contain_text("time__get_current_time")
        page.get_by_test_id("tool-deny").click()
        expect(page.locator(".msg-row.assistant").last).to_contain_text("I was not allowed.")
        denied = page.locator('details.tool[data-tool-call-id="a2"]')
        expect(denied).to_have_attribute("data-state", "error")
        assert "the user denied this call" in fake_openai.requests[-1].json["messages"][-1]["content"]
