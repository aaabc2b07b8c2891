"""Sessions that survive: resume by seq mid-stream, restore from the store, crash safety."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support import client, of_type, serve, settings_for, slow_settings, text_of

pytestmark = pytest.mark.anyio

async def test_resume_mid_stream_loses_and_repeats_nothing(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            seen = await a.start_turn()
            seen += [await a.recv(), await a.recv()]
        last_seq = seen[-1]["seq"]
        async with client(address) as b:
            session = (await b.hello(a.session_id, last_seq))[-1]
            assert session["resumed"] is True and session["seq"] == last_seq
            rest = await b.until("done")
    seqs = [f["seq"] for f in rest]
    assert seqs == list(range(last_seq + 1, last_seq + 1 + len(rest)))
    assert text_of(seen) + text_of(rest) == rest[-1]["full_response"]
    assert not of_type(rest, "history")


async def test_reconnect_without_last_seq_gets_a_snapshot_of_the_stream(tmp_path):
    with serve(slow_settings(tmp_path)) as address:
        async with client(address) as a:
            await a.hello()
            await a.start_turn()
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(config: Path, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "server", "--config", str(config), "--port", str(port),
                                "--log-level", "warning"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return process
        except httpx.TransportError:
            if process.poll() is not None:
                raise RuntimeError(process.stderr.read().decode() if process.stderr else "exited") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not answer")


async def test_sigkill_mid_stream_loses_no_user_message(tmp_path):
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\nstore_flush_ms = 50\n'
                      '[providers.demo]\nkind = "demo"\nmodel = "demo-small"\ncontext_window = 4096\n'
                      'delay_ms = 40\n')
    port = free_port()
    process = start_server(config, port)
    try:
        async with client(f"127.0.0.1:{port}") as c:
            await c.hello()
            await c.say("echo first answer")
            await c.send("message", id="q2", content="hello")
            seen = await c.until("chunk")
            for _ in range(8):
                seen.append(await c.recv())
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
        if process.stderr:
            process.stderr.close()
    process = start_server(config, port)
    try:
        async with client(f"127.0.0.1:{port}") as d:
            history = (await d.hello(c.session_id))[1]["messages"]
    finally:
        process.terminate()
        process.wait(10)
        if process.stderr:
            process.stderr.close()
    users = [m["content"] for m in history if m["role"] == "user"]
    replies = [m for m in history if m["role"] == "assistant"]
    assert users == ["echo first answer", "hello"]
    assert replies[0]["content"] == "first answer" and replies[0]["interrupted"] is False
    assert replies[1]["interrupted"] is True
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
