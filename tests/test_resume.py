"""Sessions that survive: resume by seq mid-stream, restore from the store, crash safety."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from tests.support import (
    SHORT_REPLY,
    client,
    of_type,
    run_server,
    serve,
    settings_for,
    slow_settings,
    text_of,
)

pytestmark = pytest.mark.anyio

async def test_resume_mid_stream_loses_and_repeats_nothing(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            seen = await a.start_turn(SHORT_REPLY)
            seen += [await a.recv(), await a.recv()]
        last_seq = seen[-1]["seq"]
        async with client(address) as b:
            session = (await b.hello(a.session_id, last_seq))[-1]
            assert session["resumed"] is True and session["seq"] == last_seq
            rest = await b.until("done")
    seqs = [f["seq"] for f in rest]
    # Dense unless chunks that piled up for the client left as one frame (it carries the last
    # piece's seq: docs/protocol.md), which a loaded machine does; the text says nothing was lost.
    assert seqs[0] > last_seq and seqs == sorted(set(seqs))
    assert text_of(seen) + text_of(rest) == rest[-1]["full_response"]
    assert not of_type(rest, "history")


async def test_reconnect_without_last_seq_gets_a_snapshot_of_the_stream(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            await a.start_turn(SHORT_REPLY)
            async with client(address) as b:
                frames = await b.hello(a.session_id)
                session, history = frames[0], frames[1]
                partial = [m for m in history["messages"] if m["role"] == "assistant"]
                rest = await b.until("done")
    assert session["resumed"] is True
    assert partial and partial[0]["interrupted"] is True
    assert partial[0]["content"] + text_of(rest) == rest[-1]["full_response"]


async def test_stop_from_another_client_aborts_the_turn(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            await a.start_turn()
        async with client(address) as b:
            await b.hello(a.session_id)
            await b.send("stop")
            assert (await b.until("aborted"))[-1]["type"] == "aborted"


async def test_restore_applies_the_turn_limit(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(3):
                await c.say(f"q{n}")
    with serve(settings_for(tmp_path, {"runtime": {"max_history_messages": 1}})) as address:
        async with client(address) as c2:
            frames = await c2.hello(c.session_id)
            assert frames[0]["resumed"] is True and frames[0]["message_count"] == 6
    trimmed, = of_type(frames, "history_trimmed")
    assert trimmed["reason"] == "turn_limit" and trimmed["kept_turns"] == 1
    assert trimmed["dropped_messages"] == 4 and frames[-1]["reason"] == "restore"


async def test_sigkill_mid_stream_loses_no_user_message(tmp_path):
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\nstore_flush_ms = 50\n'
                      '[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\n'
                      'delay_ms = 40\n')
    with run_server(config) as first:
        async with client(first.address) as c:
            await c.hello()
            await c.say("echo first answer")
            await c.send("message", id="q2", content="hello")
            seen = await c.until("chunk")
            for _ in range(8):
                seen.append(await c.recv())
            assert first.process is not None
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(10)
    with run_server(config) as second:
        async with client(second.address) as d:
            history = (await d.hello(c.session_id))[1]["messages"]
    users = [m["content"] for m in history if m["role"] == "user"]
    replies = [m for m in history if m["role"] == "assistant"]
    assert users == ["echo first answer", "hello"]
    assert replies[0]["content"] == "first answer" and replies[0]["interrupted"] is False
    assert replies[1]["interrupted"] is True
    # Its call was never recorded (a call's record is written when it ends): the reply says itself
    # which route wrote it.
    assert replies[1]["route"] == {"provider": "demo", "model": "demo-small", "route_kind": "default"}
    streamed = text_of(seen)
    assert replies[1]["content"] and streamed.startswith(replies[1]["content"][: len(streamed) // 2])


async def test_disconnect_stops_the_turn_when_keep_generating_is_off(tmp_path):
    settings = slow_settings(tmp_path, keep_generating=False)
    with serve(settings) as address:
        async with client(address) as a:
            await a.hello()
            await a.start_turn()
        await anyio.sleep(0.3)  # the demo reply takes seconds at this pace; the server has seen the close
        async with client(address) as b:
            frames = await b.hello(a.session_id)
            later = []
            with anyio.move_on_after(1.0):
                later.append(await b.recv())
    replies = [m for m in frames[1]["messages"] if m["role"] == "assistant"]
    assert len(replies) == 1 and replies[0]["interrupted"] is True
    assert later == []  # nothing streams any more: the turn was stopped, not merely unobserved
