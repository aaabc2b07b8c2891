"""What a reload gets back, over a real server and socket: trims where they happened, each reply's
route, usage and cost, tool calls with their results, images by URL (behind the token), a reply
still streaming marked so; and the socket's answer to a wrong token (4401 after accepting)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import (
    SHORT_REPLY,
    client,
    of_type,
    serve,
    settings_for,
    slow_settings,
    text_of,
)

pytestmark = pytest.mark.anyio
PRICED_DEMO = {"kind": "demo", "model": "demo-small", "context_window": 4096, "delay_ms": 0,
               "price_input_per_mtok": 3.0, "price_output_per_mtok": 15.0}
DEMO_ROUTE = {"provider": "demo", "model": "demo-small", "route_kind": "default"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"pixels" * 10).decode()


async def reopened(address: str, session_id: str | None) -> dict[str, Any]:
    """The ``history`` frame a new tab (a reload) receives."""
    async with client(address) as tab:
        history: dict[str, Any] = (await tab.hello(session_id))[1]
    assert history["type"] == "history"
    return history


async def test_trims_come_back_with_the_turn_they_happened_in(tmp_path):
    settings = settings_for(tmp_path, {"runtime": {"max_history_messages": 1}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            for word in ("one", "two", "three"):
                frames = await c.say(f"echo {word}")
            live = [{k: v for k, v in f.items() if k not in ("type", "seq")}
                    for f in c.frames if f["type"] == "history_trimmed"]
            session_id = c.session_id
    with serve(settings) as address:  # after a restart: from the store
        history = await reopened(address, session_id)
    assert len(live) == 2 and live[-1]["turn_id"] == of_type(frames, "accepted")[0]["turn_id"]
    kept = [{k: v for k, v in t.items() if k != "created_at"} for t in history["trims"]]
    assert kept == live
    assert all(t["created_at"] for t in history["trims"])


async def test_a_restore_trim_says_which_message_it_follows(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            for word in ("one", "two", "three"):
                await c.say(f"echo {word}")
            session_id = c.session_id
    fewer = settings_for(tmp_path, {"runtime": {"max_history_messages": 1}})
    with serve(fewer) as address:
        async with client(address) as c:
            assert of_type(await c.hello(session_id), "history_trimmed")  # before the meter
        history = await reopened(address, session_id)
    (trim,) = history["trims"]
    assert "turn_id" not in trim and trim["reason"] == "turn_limit"
    assert trim["after_message_id"] == history["messages"][-1]["id"]


async def test_replies_carry_their_route_and_the_turn_usage_and_cost(tmp_path):
    settings = settings_for(tmp_path, {"providers": {"demo": PRICED_DEMO}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            plain = await c.say("echo hello there")
            tools = await c.say("please look up paper moon")
            hinted = await c.say("/hint nothing echo hinted")
            session_id = c.session_id
    with serve(settings) as address:
        history = await reopened(address, session_id)
    replies = [m for m in history["messages"] if m["role"] == "assistant"]
    route = {"provider": "demo", "model": "demo-small", "route_kind": "default"}
    # a hinted turn's reply says its hint too, as its route frame did
    assert of_type(hinted, "route")[0]["hint"] == "nothing"
    assert [m["route"] for m in replies] == [route] * (len(replies) - 1) + [
        {**route, "route_kind": "fallback", "hint": "nothing"}]
    for frames, reply in ((plain, replies[0]), (tools, replies[2])):
        done = of_type(frames, "done")[0]
        usage = reply["usage"]
        assert (usage["input_tokens"], usage["output_tokens"], usage["last_input_tokens"]) == \
            (done["input_tokens"], done["output_tokens"], done["last_input_tokens"])
        assert usage["cost_usd"] == pytest.approx(done["cost_usd"])
        assert reply["created_at"] == done["created_at"]
    assert replies[0]["usage"]["calls"] == 1 and replies[2]["usage"]["calls"] == 2
    assert "usage" not in replies[1]  # the reply that asked for the tool: its turn goes on
    thinking = "".join(f["content"] for f in of_type(tools, "thinking"))
    assert thinking and "".join(m.get("thinking", "") for m in replies[1:3]) == thinking
    call = replies[1]["tool_calls"][0]
    result = next(m for m in history["messages"] if m.get("tool_call_id") == call["id"])
    assert result["content"] == of_type(tools, "tool_result")[0]["output"]


async def test_a_reply_still_streaming_is_marked_so(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            started = await a.start_turn(SHORT_REPLY)
            async with client(address) as b:
                history = (await b.hello(a.session_id))[1]
                rest = await b.until("done")
            history_after = await reopened(address, a.session_id)
    turn = of_type(started, "accepted")[0]["turn_id"]
    assert history["turn_in_flight"] == turn
    reply = history["messages"][-1]
    assert reply["streaming"] is True and reply["turn_id"] == turn
    assert reply["route"] == DEMO_ROUTE  # its first call has not ended: the route its route frame named
    assert reply["content"] + text_of(rest) == of_type(rest, "done")[0]["full_response"]
    assert "turn_in_flight" not in history_after
    assert "streaming" not in history_after["messages"][-1]
    assert history_after["messages"][-1]["route"] == DEMO_ROUTE


async def test_a_reply_stopped_in_its_first_call_keeps_its_route(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            started = await a.start_turn(SHORT_REPLY)
            await a.send("stop")
            await a.until("aborted")
        history = await reopened(address, a.session_id)
    turn = of_type(started, "accepted")[0]["turn_id"]
    reply = history["messages"][-1]
    # A stopped call is not recorded; the reply keeps the route its call was sent to.
    assert reply["interrupted"] is True and reply["route"] == DEMO_ROUTE
    stopped = [n for n in history["notices"] if n["type"] == "aborted"]
    began = of_type(started, "route")[0]["created_at"]  # the call's start: the stopped reply's time
    assert stopped == [{"type": "aborted", "turn_id": turn, "route": {**DEMO_ROUTE, "created_at": began},
                        "created_at": stopped[0]["created_at"], "after_message_id": reply["id"]}]
    assert reply["created_at"] == began


async def test_images_are_served_by_url_behind_the_token(tmp_path):
    token = {"Authorization": "Bearer s3cret"}
    with serve(settings_for(tmp_path, auth_token="s3cret")) as address:
        async with client(address, "?token=s3cret") as c:
            await c.hello()
            image = {"media_type": "image/png", "data": PNG}
            await c.send("message", id="pic", content="echo look", images=[image, image])
            frames = await c.until("done")
        async with client(address, "?token=s3cret") as tab:
            history = (await tab.hello(c.session_id))[1]
        urls = history["messages"][0]["image_urls"]
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            got = await http.get(urls[1], headers=token)
            refused = await http.get(urls[1])
            missing = await http.get(urls[1][:-1] + "2", headers=token)
            unknown = await http.get("/api/sessions/nope/images/pic/0", headers=token)
    assert of_type(frames, "accepted")[0]["image_urls"] == urls
    assert urls == [f"/api/sessions/{c.session_id}/images/pic/{n}" for n in (0, 1)]
    assert PNG not in json.dumps(history)  # the bytes travel by URL, not in the frame
    assert got.status_code == 200 and got.content == base64.b64decode(PNG)
    assert got.headers["content-type"] == "image/png"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert [refused.status_code, missing.status_code, unknown.status_code] == [401, 404, 404]


async def test_a_wrong_token_is_accepted_then_closed_with_4401(tmp_path):
    with serve(settings_for(tmp_path, auth_token="s3cret")) as address:
        for query in ("", "?token=wrong"):
            async with client(address, query, subprotocols=["meterchat.v1"]) as c:
                assert c.ws.subprotocol == "meterchat.v1"  # the handshake was accepted
                with pytest.raises(ConnectionClosed) as closed:
                    await c.hello()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        with pytest.raises(InvalidStatus):  # a foreign origin is still refused before the handshake
            async with client(address, "?token=s3cret", origin="http://evil.example") as c:
                await c.hello()


async def test_the_page_gets_the_subprotocol_and_image_limit(tmp_path):
    settings = settings_for(tmp_path, {"runtime": {"max_image_bytes": 12345}})
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            page = (await http.get("/")).text
    blob = page.split('id="page-config">', 1)[1].split("</script>", 1)[0]
    assert json.loads(blob) == {"subprotocol": "meterchat.v1", "max_image_bytes": 12345}


async def test_an_image_is_served_from_the_store_after_a_restart(tmp_path):
    settings = settings_for(tmp_path)
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            image = {"media_type": "image/webp", "data": PNG}
            await c.send("message", id="pic", content="echo look", images=[image])
            url = of_type(await c.until("done"), "accepted")[0]["image_urls"][0]
    with serve(settings) as address:  # nobody opened the session: the store answers
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            got = await http.get(url)
    assert got.status_code == 200 and got.content == base64.b64decode(PNG)
    assert got.headers["content-type"] == "image/webp"
