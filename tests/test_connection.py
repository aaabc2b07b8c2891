from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import httpx
import pytest

import server.web.app as app_module
from tests.support import client, of_type, serve, settings_for, slow_settings, text_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def address(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        yield address


async def test_hello_opens_a_session_with_routes_and_meter(address):
    async with client(address) as c:
        frames = await c.hello()
    session, history, context = frames
    assert session["type"] == "session" and session["resumed"] is False
    assert session["routes"] == ["demo/demo-small", "demo/demo-open"]
    assert session["route"] == "demo/demo-small"
    assert history == {"type": "history", "messages": [], "seq": session["seq"]}
    assert context["reason"] == "hello" and context["model_context_window"] == 4096
    assert context["window_source"] == "config" and context["context_token_budget"] == 4096
    assert context["seq"] > session["seq"]


async def test_message_streams_chunks_then_done(address):
    async with client(address) as c:
        await c.hello()
        frames = await c.say("hello there")
    kinds = [f["type"] for f in frames]
    assert kinds[:2] == ["accepted", "title"]
    assert "route" in kinds and "thinking" in kinds
    done = frames[-1]
    assert done["type"] == "done"
    assert len(of_type(frames, "chunk")) > 5
    assert text_of(frames) == done["full_response"]
    assert "demo-small" in done["full_response"]
    assert done["input_tokens"] > 0 and done["model_context_window"] == 4096
    usage = [f for f in of_type(frames, "context") if f["reason"] == "usage"]
    assert usage and usage[-1]["tokens_source"] == "provider"
    assert usage[-1]["estimated_tokens"] == done["last_input_tokens"]
    seqs = [f["seq"] for f in frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("raw, code", [
    ("{not json", "bad_frame"),
    ('["a list"]', "bad_frame"),
    ('{"type": "dance"}', "unknown_type"),
    ('{"type": "message", "id": 5, "content": "x"}', "bad_frame"),
    ('{"type": "message", "id": "a", "content": "   "}', "bad_frame"),
    ('{"type": "switch_model"}', "bad_frame"),
])
async def test_bad_frames_get_errors_and_the_session_goes_on(address, raw, code):
    async with client(address) as c:
        await c.hello()
        await c.send_raw(raw)
        error = await c.recv()
        assert error["type"] == "error" and error["code"] == code and error["retryable"] is False
        frames = await c.say("still here?")
    assert frames[-1]["type"] == "done"


async def test_frame_before_hello_is_refused_and_hello_still_works(address):
    async with client(address) as c:
        await c.send("message", id="m1", content="hi")
        error = await c.recv()
        assert error["code"] == "bad_frame" and "hello" in error["message"]
        frames = await c.hello()
    assert frames[0]["type"] == "session"


async def test_switch_to_unknown_capacity_omits_the_window(address):
    async with client(address) as c:
        await c.hello()
        await c.send("switch_model", route="demo/demo-open")
        context = (await c.until("context"))[-1]
        assert context["reason"] == "switch" and context["model"] == "demo-open"
        assert "model_context_window" not in context and "window_source" not in context
        assert context["context_token_budget"] == 32000
        frames = await c.say("what do you see?")
    done = frames[-1]
    assert done["model"] == "demo-open" and "model_context_window" not in done
    assert done["max_context_tokens"] == 32000
    assert all("model_context_window" not in f for f in of_type(frames, "context"))


async def test_model_command_switches_and_unknown_route_changes_nothing(address):
    async with client(address) as c:
        await c.hello()
        await c.send("message", id="m1", content="/model nowhere/x")
        notice = await c.recv()  # issue 10: a command is answered with what exists, not an error
        assert notice["type"] == "notice" and notice["code"] == "unknown_route"
        assert "'nowhere'" in notice["message"] and "demo/demo-open" in notice["message"]
        await c.send("message", id="m2", content="/model demo/demo-open")
        context = await c.recv()
        assert context["type"] == "context" and context["model"] == "demo-open"
        await c.send("switch_model", route="demo/nope")
        assert (await c.recv())["code"] == "unknown_route"
        frames = await c.say("and now?")
    assert frames[-1]["model"] == "demo-open"


async def test_oversized_image_is_rejected_and_nothing_is_stored(tmp_path):
    settings = settings_for(tmp_path, {"runtime": {"max_image_bytes": 100}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            big = base64.b64encode(b"x" * 101).decode()
            image = {"media_type": "image/png", "data": big}
            await c.send("message", id="img1", content="look", images=[image])
            error = await c.recv()
            assert error["code"] == "image_rejected" and error["message_id"] == "img1"
            assert "101 bytes" in error["message"]
            await c.send("message", id="img2", content="x", images=[{"media_type": "text/html", "data": ""}])
            assert (await c.recv())["code"] == "image_rejected"
            small = base64.b64encode(b"\x89PNG....").decode()
            frames = await c.say("look", id="img3", images=[{"media_type": "image/png", "data": small}])
            assert frames[0]["type"] == "accepted" and frames[0]["images"] == 1
        async with client(address) as d:
            frames = await d.hello(c.session_id)
    history = of_type(frames, "history")[0]["messages"]
    assert [m["id"] for m in history if m["role"] == "user"] == ["img3"]
    assert history[0]["images"] == 1


async def test_second_message_while_busy_is_refused(tmp_path):
    settings = slow_settings(tmp_path)
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.start_turn(message_id="a")
            await c.send("message", id="b", content="again")
            frames = await c.until("error")
            assert frames[-1]["code"] == "busy" and frames[-1]["message_id"] == "b"
            await c.send("stop")
            assert (await c.until("aborted"))[-1]["type"] == "aborted"


async def test_stop_aborts_and_keeps_the_partial_reply_marked(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            await c.start_turn(message_id="a")
            await c.until("chunk")
            await c.send("stop")
            frames = await c.until("aborted")
            assert not of_type(frames, "done")
        async with client(address) as d:
            frames = await d.hello(c.session_id)
    messages = of_type(frames, "history")[0]["messages"]
    reply = [m for m in messages if m["role"] == "assistant"]
    assert len(reply) == 1 and reply[0]["interrupted"] is True and reply[0]["content"]


async def test_tool_loop_streams_tool_frames(address):
    async with client(address) as c:
        await c.hello()
        frames = await c.say("please look up the paper moon")
    call, = of_type(frames, "tool_call")
    result, = of_type(frames, "tool_result")
    assert call["name"] == "lookup_document" and call["args"] == {"title": "paper moon"}
    assert result["id"] == call["id"] and "Paper Moon" in result["output"]
    assert len(of_type(frames, "route")) == 2
    assert "Paper Moon" in frames[-1]["full_response"]


async def test_two_tabs_see_the_same_stream(address):
    async with client(address) as a:
        await a.hello()
        async with client(address) as b:
            await b.hello(a.session_id)
            await a.say("hello")
            frames_b = await b.until("done")
    assert of_type(frames_b, "accepted")[0]["content"] == "hello"
    assert text_of(frames_b) == frames_b[-1]["full_response"]


async def test_coalescing_joins_chunks_without_losing_text(tmp_path):
    with serve(settings_for(tmp_path, coalesce_ms=50)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("hello")
    chunks = of_type(frames, "chunk")
    assert text_of(frames) == frames[-1]["full_response"]
    assert len(chunks) < len(frames[-1]["full_response"].split())


async def test_idle_sessions_leave_the_cache_and_come_back_from_the_store(tmp_path, monkeypatch):
    monkeypatch.setattr("server.sessions.cache.MAX_CACHED_SESSIONS", 2)
    with serve(settings_for(tmp_path)) as address:
        ids, last = [], []
        for n in range(4):
            async with client(address) as c:
                await c.hello()
                last.append((await c.say(f"echo session {n}"))[-1]["seq"])
                ids.append(c.session_id)
        async with client(address) as c:
            recent = await c.hello(ids[3], last[3])
            assert recent[0]["seq"] == last[3]  # still cached: a replay (here of nothing)
        async with client(address) as c:
            frames = await c.hello(ids[0], last[0])
            frames.append(await c.recv())
    assert frames[0]["session_id"] == ids[0] and frames[0]["resumed"] is True
    assert frames[1]["type"] == "history"  # evicted: its log is gone, so a snapshot from the store
    assert frames[0]["seq"] > last[0]  # a new incarnation numbers above the old one
    assert [m["content"] for m in frames[1]["messages"]] == ["echo session 0", "session 0"]


async def test_rename_through_the_api_reaches_open_tabs_without_stopping_the_turn(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            await c.start_turn(message_id="a")
            async with httpx.AsyncClient(base_url=f"http://{address}") as http:
                renamed = await http.patch(f"/api/sessions/{c.session_id}", json={"title": "Renamed"})
                assert renamed.status_code == 200
                frames = await c.until("title")
                assert frames[-1]["title"] == "Renamed"
                rest = await c.until("done", "aborted", "error")
                assert rest[-1]["type"] == "done"
                deleted = await http.delete(f"/api/sessions/{c.session_id}")
                assert deleted.status_code == 204
                gone = await c.until("error")
    assert gone[-1]["code"] == "unknown_session"


async def test_two_tabs_sending_at_once_start_exactly_one_turn(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a, client(address) as b:
            await a.hello()
            await b.hello(a.session_id)
            for _ in range(3):
                await asyncio.gather(a.send("message", id=uuid.uuid4().hex, content="from a"),
                                     b.send("message", id=uuid.uuid4().hex, content="from b"))
                await a.until("chunk")
                await a.send("stop")
                seen_a, seen_b = await a.until("aborted"), await b.until("aborted")
                accepted = {f["id"] for f in of_type(seen_a + seen_b, "accepted")}
                busy = [f for f in of_type(seen_a + seen_b, "error") if f["code"] == "busy"]
                assert len(accepted) == 1 and len(busy) == 1


async def test_binary_and_repeated_hello_frames_get_errors(address):
    async with client(address) as c:
        await c.hello()
        await c.ws.send(b"\x00\x01binary")
        error = await c.recv()
        assert error["code"] == "bad_frame" and "binary" in error["message"]
        await c.send("hello")
        again = await c.recv()
        assert again["code"] == "bad_frame" and "already said hello" in again["message"]
        assert (await c.say("still fine"))[-1]["type"] == "done"


async def test_history_clips_long_tool_results_but_the_export_keeps_them(address):
    async with client(address) as c:
        await c.hello()
        frames = await c.say("look up the paper moon")
        full = of_type(frames, "tool_result")[0]["output"]
    async with client(address) as d:
        history = (await d.hello(c.session_id))[1]["messages"]
    tool, = [m for m in history if m["role"] == "tool"]
    if len(full) <= 8000:
        assert tool["content"] == full
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        exported = (await http.get(f"/api/sessions/{c.session_id}/export?format=json")).json()
    assert [m["content"] for m in exported["messages"] if m["role"] == "tool"] == [full]


async def assistant_id(address: str, session_id: str) -> str:
    async with client(address) as c:
        frames = await c.hello(session_id)
    history = of_type(frames, "history")[0]
    return next(m["id"] for m in history["messages"] if m["role"] == "assistant")


async def test_message_id_of_a_stored_reply_is_a_bad_frame_and_the_connection_goes_on(address):
    async with client(address) as c:
        await c.hello()
        await c.say("first question")
        taken = await assistant_id(address, c.session_id)
        await c.send("message", id=taken, content="reusing a reply's id")
        error = (await c.until("error"))[-1]
        assert error["code"] == "bad_frame" and error["message_id"] == taken
        assert taken in error["message"]
        assert (await c.say("still here"))[-1]["type"] == "done"



async def test_a_new_sessions_first_message_stores_it_titled_in_one_write(tmp_path, monkeypatch):
    # The session is created with the title its first message gives it, not created and renamed:
    # a write less before the first turn of every new chat.
    writes: list[str] = []
    open_store = app_module.open_store

    def counted_store(*args: Any) -> Any:
        store = open_store(*args)
        for name in ("create_session", "rename_session"):
            write = getattr(store, name)

            async def counted(*a: Any, _write: Any = write, _name: str = name, **k: Any) -> Any:
                writes.append(_name)
                return await _write(*a, **k)
            setattr(store, name, counted)
        return store

    monkeypatch.setattr(app_module, "open_store", counted_store)
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("a first   question\nabout lighthouses")
            second = await c.say("and a second one")
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            listed = (await http.get("/api/sessions")).json()
    assert [f["title"] for f in of_type(frames, "title")] == ["a first question about lighthouses"]
    assert not of_type(second, "title")
    assert writes == ["create_session"]
    assert [(s["id"], s["title"]) for s in listed] == [(c.session_id, "a first question about lighthouses")]
