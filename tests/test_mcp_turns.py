"""The tool loop on the wire: a fake OpenAI-compatible provider (a real HTTP server) asks for MCP tool
calls, real MCP servers answer, and the next request carries the results in order, paired by id,
capped; the page's frames say which server ran each call and what its result cost."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tests.fakes import Call, Reply
from tests.mcp_support import everything_stdio, faulty_server, time_server
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def settings(tmp_path, fake, servers: dict[str, Any], runtime: dict[str, Any] | None = None, **profile):
    provider = {"kind": "openai", "base_url": fake.base_url, "model": "m1", "discover_window": False,
                **profile}
    return settings_for(tmp_path, {"providers": {"p": provider}, "mcp_servers": servers,
                                   "runtime": runtime or {}})


def sent_messages(fake, index: int) -> list[dict[str, Any]]:
    return fake.requests[index].json["messages"]


async def test_time_results_reach_the_model_in_order_paired_by_id(tmp_path, fake_openai):
    fake_openai.enqueue(
        Reply(tool_calls=[Call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "call_a"),
                          Call("time__convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                      "target_timezone": "Asia/Tokyo"}, "call_b")]),
        Reply(text=["It is evening in Tokyo."]))
    with serve(settings(tmp_path, fake_openai, {"time": time_server()})) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("what time is it in Tokyo?")
    assert frames[-1]["type"] == "done" and frames[-1]["full_response"] == "It is evening in Tokyo."
    offered = [tool["function"]["name"] for tool in fake_openai.requests[0].json["tools"]]
    assert offered == ["time__get_current_time", "time__convert_time"]  # and no demo lookup
    second = sent_messages(fake_openai, 1)
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "tool"]
    assert [call["id"] for call in second[-3]["tool_calls"]] == ["call_a", "call_b"]
    assert [m["tool_call_id"] for m in second[-2:]] == ["call_a", "call_b"]
    assert json.loads(second[-2]["content"])["timezone"] == "Asia/Tokyo"
    assert "12:00" in second[-1]["content"] or "21:00" in second[-1]["content"]
    calls, results = of_type(frames, "tool_call"), of_type(frames, "tool_result")
    assert [(f["id"], f["server"]) for f in calls] == [("call_a", "time"), ("call_b", "time")]
    assert [(f["id"], f["is_error"], f["truncated_chars"]) for f in results] == [("call_a", False, 0),
                                                                                   ("call_b", False, 0)]
    assert all(f["tokens"] > 4 for f in results)
    sends = [f for f in of_type(frames, "context") if f["reason"] == "send"]
    assert sends[0]["tool_servers"]["time"] == sends[0]["tool_schema_tokens"] > 0


async def test_huge_result_is_capped_marked_and_the_chat_goes_on(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[Call("f__flood", {"size": 200_000}, "c1")]), Reply(text=["ok"]),
                        Reply(text=["still here"]))
    data = settings(tmp_path, fake_openai, {"f": faulty_server()}, {"max_tool_result_chars": 1000})
    with serve(data) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("flood me")
            after = await c.say("and now?")
    result = of_type(frames, "tool_result")[0]
    assert result["truncated_chars"] == 199_000
    assert "[... 199000 characters truncated ...]" in result["output"]
    tool_message = sent_messages(fake_openai, 1)[-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == result["output"]
    assert len(tool_message["content"]) < 1100
    assert after[-1]["type"] == "done" and after[-1]["full_response"] == "still here"


async def test_tool_image_is_sent_and_counted_in_its_turn(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[Call("ev__get-tiny-image", {}, "img")]), Reply(text=["a logo"]),
                        Reply(text=["next"]))
    data = settings(tmp_path, fake_openai, {"ev": everything_stdio()}, {"image_token_cost": 700})
    with serve(data) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("show me")
            later = await c.say("and now?")
    second = sent_messages(fake_openai, 1)
    assert second[-2]["role"] == "tool" and second[-2]["tool_call_id"] == "img"
    assert second[-1]["role"] == "user" and second[-1]["content"][0]["type"] == "image_url"
    sends = [f for f in of_type(frames, "context") if f["reason"] == "send"]
    assert [f["image_tokens"] for f in sends] == [0, math.ceil(700 * sends[1]["calibration_ratio"])]
    # the next turn sends the old result as text alone, and the meter counts no image for it
    third = json.dumps(sent_messages(fake_openai, 2))
    assert "image_url" not in third and "[image: image/png," in third
    assert [f["image_tokens"] for f in of_type(later, "context") if f["reason"] == "send"] == [0]


async def test_tool_error_and_unknown_tool_go_to_the_model_as_errors(tmp_path, fake_openai):
    fake_openai.enqueue(
        Reply(tool_calls=[Call("time__get_current_time", {"timezone": "Nowhere/Atlantis"}, "bad"),
                          Call("lookup_document", {"title": "paper moon"}, "nope")]),
        Reply(text=["sorry"]))
    with serve(settings(tmp_path, fake_openai, {"time": time_server()})) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("time on Atlantis?")
    results = of_type(frames, "tool_result")
    assert [(r["id"], r["is_error"]) for r in results] == [("bad", True), ("nope", True)]
    assert "server" not in of_type(frames, "tool_call")[1]
    second = sent_messages(fake_openai, 1)
    assert second[-2]["content"].startswith("error: ") and "Nowhere/Atlantis" in second[-2]["content"]
    assert "unknown tool 'lookup_document'" in second[-1]["content"]
    assert frames[-1]["type"] == "done"


async def test_real_provider_without_servers_is_offered_no_tools(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["hi"]))
    with serve(settings(tmp_path, fake_openai, {})) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("hello")
    assert frames[-1]["type"] == "done" and "tools" not in fake_openai.requests[0].json


async def test_missing_server_is_a_notice_and_the_turn_goes_on(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["hi"]))
    servers = {"gone": {"command": "meterchat-no-such-mcp-server", "start_timeout_seconds": 5}}
    with serve(settings(tmp_path, fake_openai, servers)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("hello")
    notices = [f for f in of_type(frames, "notice") if f["code"] == "tools_unavailable"]
    assert len(notices) == 1 and "gone" in notices[0]["message"]
    assert frames[-1]["type"] == "done"


async def test_healthz_answers_while_a_flood_is_read(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[Call("f__flood", {"size": 64 * 1024 * 1024}, "c1")]),
                        Reply(text=["done"]))
    data = settings(tmp_path, fake_openai, {"f": faulty_server(max_result_bytes=1024 * 1024)})
    with serve(data) as address:
        async with client(address) as c, httpx.AsyncClient() as http:
            await c.hello()
            await c.send("message", id="m1", content="flood")
            await c.until("tool_call")
            health = await http.get(f"http://{address}/healthz")
            frames = await c.until("done", "error")
    assert health.status_code == 200
    result = of_type(c.frames, "tool_result")[0]
    assert result["is_error"] and "over max_result_bytes" in result["output"]
    assert frames[-1]["type"] == "done"


async def test_repeated_call_ids_are_made_unique_so_no_result_is_lost(tmp_path, fake_openai):
    # The fake numbers calls per reply (call_fake_0 each time), as a server that sends no ids does.
    asks = Reply(tool_calls=[Call("time__get_current_time", {"timezone": "UTC"})])
    fake_openai.enqueue(asks, asks, Reply(text=["twice"]), asks, Reply(text=["again"]))
    with serve(settings(tmp_path, fake_openai, {"time": time_server()})) as address:
        async with client(address) as c:
            await c.hello()
            first = await c.say("time twice")
            second = await c.say("and once more")
    assert first[-1]["full_response"] == "twice" and second[-1]["full_response"] == "again"
    assert len(fake_openai.requests) == 5  # no loop to the tool cap
    last = sent_messages(fake_openai, 4)
    calls = [call["id"] for m in last if m["role"] == "assistant" for call in m.get("tool_calls") or ()]
    results = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert len(set(calls)) == 3 and results == calls


async def test_the_offline_demo_calls_an_mcp_tool_its_message_names(tmp_path):
    """The README's three lines on the embedded demo: "what time is it in Tokyo?" calls the time
    server with the zone the message names, and the demo quotes the result back."""
    settings = settings_for(tmp_path, {"mcp_servers": {"time": time_server()}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("what time is it in Tokyo?")
            lookup = await c.say("please look up the paper moon")
            plain = await c.say("hello there")
    calls, results = of_type(frames, "tool_call"), of_type(frames, "tool_result")
    assert [(f["name"], f["server"], f["args"]) for f in calls] == [
        ("time__get_current_time", "time", {"timezone": "Asia/Tokyo"})]
    assert json.loads(results[0]["output"])["timezone"] == "Asia/Tokyo" and not results[0]["is_error"]
    assert frames[-1]["type"] == "done" and "Asia/Tokyo" in frames[-1]["full_response"]
    assert [f["name"] for f in of_type(lookup, "tool_call")] == ["lookup_document"]  # its own, still
    assert not of_type(plain, "tool_call") and plain[-1]["type"] == "done"
