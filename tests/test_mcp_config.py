"""[mcp_servers.NAME] and [providers.X] tools: what start-up accepts and refuses, and the names and
bounds of what a model is offered (pure: no server started)."""

from __future__ import annotations

import logging
import re

import pytest

from server.config.load import settings_from_mapping
from server.config.settings import McpServerSettings
from server.errors import ConfigError
from server.tools.catalog import MAX_NAME, bounded_tools, model_name, schema_bytes, selected
from server.tools.http import headers_from_env

OPENAI = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}


def load(servers, tools=True):
    return settings_from_mapping({"mcp_servers": servers, "providers": {"p": {**OPENAI, "tools": tools}}},
                                 env={})


def test_stdio_and_http_servers_load():
    settings = load({"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
                     "web": {"url": "https://mcp.example.com/mcp", "headers_env": {"Authorization": "T"},
                             "approve_tools": {"fetch": "always"}}}, tools=["time", "web/fetch"])
    time, web = settings.mcp_servers["time"], settings.mcp_servers["web"]
    assert (time.transport, web.transport) == ("stdio", "http")
    assert web.approval("fetch") == "always" and web.approval("other") == "never"
    assert settings.providers["p"].tools == ["time", "web/fetch"]


@pytest.mark.parametrize(("servers", "tools", "message"), [
    ({"a": {}}, True, "mcp_servers.a: set exactly one of command (stdio) or url"),
    ({"a": {"command": "x", "url": "http://h/mcp"}}, True, "set exactly one of command"),
    ({"a": {"url": "ftp://h"}}, True, "mcp_servers.a.url: expected an http:// or https:// URL"),
    ({"a": {"command": "x", "approve": "sometimes"}}, True, "mcp_servers.a.approve: expected one of never"),
    ({"a": {"command": "x", "approve_tools": {"t": "maybe"}}}, True, "mcp_servers.a.approve_tools.t"),
    ({"a": {"command": "x", "call_timeout_seconds": 0}}, True, "call_timeout_seconds: must be greater"),
    ({"a": {"command": "x", "env": {"K": 1}}}, True, "mcp_servers.a.env.K: expected str"),
    ({"a": {"command": "x", "colour": "red"}}, True, "mcp_servers.a.colour: unknown setting"),
    ({"a b": {"command": "x"}}, True, "a server name is 1 to 32 letters"),
    ({"a__b": {"command": "x"}}, True, 'without "__"'),
    ({"a": {"command": "x"}}, ["b"], "providers.p.tools: 'b' names no [mcp_servers] server"),
    ({"a": {"command": "x"}}, "a", "providers.p.tools: expected value"),
])
def test_bad_tables_stop_start_up_naming_the_key(servers, tools, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(servers, tools)


def test_model_names_are_safe_unique_and_stable():
    assert model_name("time", "get_current_time") == "time__get_current_time"
    dotted, spaced = model_name("fs", "read.file"), model_name("fs", "read file")
    assert dotted != spaced and dotted.startswith("fs__read_file_")
    assert dotted == model_name("fs", "read.file")  # the same name at every start
    long = model_name("server", "t" * 100)
    assert len(long) == MAX_NAME and long != model_name("server", "t" * 101)


def test_bounds_keep_the_first_tools_that_fit(caplog):
    caplog.set_level(logging.WARNING)
    settings = McpServerSettings(name="s", command="x", max_tools=3, max_schema_bytes=10_000)
    listed = [(f"t{n}", "d" * (4000 if n == 1 else 10), {"type": "object"}) for n in range(6)]
    kept = bounded_tools(settings, listed)
    assert [t.tool for t in kept] == ["t0", "t1", "t2"]
    assert sum(schema_bytes(t.spec) for t in kept) <= 10_000
    assert "s: 3 tools left out" in caplog.text
    small = bounded_tools(McpServerSettings(name="s", command="x", max_schema_bytes=100), listed)
    assert "t1" not in [t.tool for t in small] and sum(schema_bytes(t.spec) for t in small) <= 100


def test_selection_by_server_and_tool():
    settings = McpServerSettings(name="s", command="x")
    tools = bounded_tools(settings, [("a", "", None), ("b", "", None)])
    assert selected(tools, True) == tools and selected(tools, False) == []
    assert [t.tool for t in selected(tools, ["s/b"])] == ["b"] and selected(tools, ["s"]) == tools


def test_headers_come_from_the_environment_and_a_missing_one_is_left_out(caplog):
    settings = McpServerSettings(name="s", url="http://h/mcp", headers_env={"Authorization": "TOKEN_VAR",
                                                                             "X-Other": "UNSET_VAR"})
    assert headers_from_env(settings, {"TOKEN_VAR": "Bearer s3cret"}) == {"Authorization": "Bearer s3cret"}
    assert "UNSET_VAR" in caplog.text and "s3cret" not in caplog.text
