"""Approval of tool calls (approve = "always"): the page is asked, the turn waits on the answer
alone, a denial reaches the model as a tool error, and a client that reloads while it waits is
asked again (the history frame carries the question)."""

from __future__ import annotations

import pytest

from tests.fakes import Call, Reply
from tests.mcp_support import time_server
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio
TOKYO = Call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "t1")


def settings(tmp_path, fake, runtime=None, **server):
    provider = {"kind": "openai", "base_url": fake.base_url, "model": "m1", "discover_window": False}
    demo = {"kind": "demo", "model": "demo-small", "delay_ms": 0}
    return settings_for(tmp_path, {"providers": {"p": provider, "d": demo},
                                   "default_route": "p", "runtime": runtime or {},
                                   "mcp_servers": {"time": time_server(approve="always", **server)}})


async def test_allowed_call_runs_once_answered(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[TOKYO]), Reply(text=["evening"]))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m1", content="time in Tokyo?")
            asked = (await c.until("tool_approval"))[-1]
            assert asked == {**asked, "id": "t1", "server": "time", "name": "time__get_current_time",
                             "args": {"timezone": "Asia/Tokyo"}}
            assert len(fake_openai.requests) == 1  # nothing runs before the answer
            await c.send("tool_decision", turn_id=asked["turn_id"], id="t1", allow=True)
            frames = await c.until("done", "error")
    assert of_type(frames, "tool_decided")[0]["allow"] is True
    result = of_type(frames, "tool_result")[0]
    assert not result["is_error"] and "Asia/Tokyo" in result["output"]
    assert "Asia/Tokyo" in fake_openai.requests[1].json["messages"][-1]["content"]


async def test_denied_call_is_a_tool_error_for_the_model(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[TOKYO]), Reply(text=["I may not look"]))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m1", content="time in Tokyo?")
            asked = (await c.until("tool_approval"))[-1]
            await c.send("tool_decision", turn_id=asked["turn_id"], id="t1", allow=False)
            frames = await c.until("done", "error")
    result = of_type(frames, "tool_result")[0]
    assert result["is_error"] and "the user denied this call" in result["output"]
    sent = fake_openai.requests[1].json["messages"][-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "t1" and "denied" in sent["content"]
    assert frames[-1]["full_response"] == "I may not look"


async def test_question_survives_a_reload_and_other_sessions_go_on(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[TOKYO]), Reply(text=["evening"]))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as first:
            await first.hello()
            await first.send("message", id="m1", content="time in Tokyo?")
            asked = (await first.until("tool_approval"))[-1]
        async with client(address) as other:  # another session meanwhile: not held by the wait
            await other.hello()
            await other.send("switch_model", route="d")
            switched = (await other.until("context", "error"))[-1]
            assert switched["type"] == "context", switched
            assert (await other.say("echo hello"))[-1]["type"] == "done"
        async with client(address) as reloaded:
            history = of_type(await reloaded.hello(first.session_id), "history")[0]
            assert [a["id"] for a in history["approvals"]] == ["t1"]
            assert history["turn_in_flight"] == asked["turn_id"]
            await reloaded.send("tool_decision", turn_id=asked["turn_id"], id="t1", allow=True)
            frames = await reloaded.until("done", "error")
            await reloaded.send("tool_decision", turn_id=asked["turn_id"], id="t1", allow=True)
            late = (await reloaded.until("error"))[-1]
    assert frames[-1]["type"] == "done" and not of_type(frames, "tool_result")[0]["is_error"]
    assert late["code"] == "bad_frame" and "waits for an answer" in late["message"]


async def test_unanswered_question_times_out_as_a_denial(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[TOKYO]), Reply(text=["no answer"]))
    data = settings(tmp_path, fake_openai, {"tool_approval_timeout_seconds": 0.3})
    with serve(data) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("time in Tokyo?")
    assert of_type(frames, "tool_decided")[0]["allow"] is False
    assert "denied" in of_type(frames, "tool_result")[0]["output"]


async def test_stop_while_waiting_ends_the_turn_and_drops_the_question(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(tool_calls=[TOKYO]))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m1", content="time in Tokyo?")
            await c.until("tool_approval")
            await c.send("stop")
            await c.until("aborted", "done", "error")
        async with client(address) as again:
            history = of_type(await again.hello(c.session_id), "history")[0]
    assert "approvals" not in history and len(fake_openai.requests) == 1
