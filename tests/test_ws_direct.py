"""The direct write of a batch of frames (``LingeringWebSocketProtocol.send_texts``, used by
``Connection.send_loop``): real uvicorn with meterchat's protocol, real websockets clients."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from server.sessions.channel import Outbox, Packet
from server.web.app import create_app
from server.web.ws_guard import SEND_TEXTS, WRITE_TEXT_NOW, LingeringWebSocketProtocol, text_frame_head
from tests.support import client, run_server, settings_for, text_of
from tests.test_outbox import small_window_socket

pytestmark = pytest.mark.anyio


def batch_app(outcome: dict[str, Any]) -> Any:
    """Accepts, sends 300 numbered frames of 1 KiB in one ``send_texts`` call, closes, then tries
    once more (which must say the socket is gone)."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        send_texts = scope["extensions"][SEND_TEXTS]
        outcome["first"] = await send_texts([f"{n:04d}" + "x" * 1020 for n in range(300)])
        await send({"type": "websocket.close", "code": 1000})
        outcome["after_close"] = await send_texts(["late"])
    return asgi


async def test_a_batch_arrives_as_its_frames_in_order_and_a_closed_socket_says_so():
    outcome: dict[str, Any] = {}
    with run_server(batch_app(outcome), ws=LingeringWebSocketProtocol) as running:
        async with connect(f"ws://{running.address}/") as ws:
            got = [message async for message in ws]
    assert [int(str(text)[:4]) for text in got] == list(range(300))
    assert all(len(text) == 1024 for text in got)
    assert outcome == {"first": True, "after_close": False}


async def test_meterchat_streams_through_the_direct_write(tmp_path):
    app = create_app(settings_for(tmp_path))
    with run_server(app, ws=LingeringWebSocketProtocol) as running:
        async with client(running.address) as c:
            await c.hello()
            frames = await c.say("hello there")
            seqs = [frame["seq"] for frame in frames]
            again = await c.say("and again")
    assert frames[-1]["type"] == "done" and again[-1]["type"] == "done"
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert text_of(frames) and text_of(again)


async def test_the_extension_is_offered_only_by_meterchats_protocol():
    seen: list[bool] = []

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            seen.append(SEND_TEXTS in scope.get("extensions", {}))
            await receive()
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1000})

    for options in ({"ws": LingeringWebSocketProtocol}, {"ws": "websockets-sansio"}):
        with run_server(asgi, **options) as running:
            async with connect(f"ws://{running.address}/") as ws:
                with anyio.fail_after(5):
                    _ = [message async for message in ws]
    assert seen == [True, False]


SIZES = (0, 1, 125, 126, 127, 65535, 65536, 70000)


def sizes_app() -> Any:
    """Sends one frame of each of ``SIZES`` bytes (the frame head's three length forms, each side of
    each bound; non-ASCII in the larger ones) in one ``send_texts`` call, then closes."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        await scope["extensions"][SEND_TEXTS]([sized(n) for n in SIZES])
        await send({"type": "websocket.close", "code": 1000})
    return asgi


def sized(n: int) -> str:
    return ("é" * (n // 2) + "x" * (n % 2)) if n > 200 else "x" * n


async def test_frames_of_every_length_form_arrive_whole():
    with run_server(sizes_app(), ws=LingeringWebSocketProtocol) as running:
        async with connect(f"ws://{running.address}/", max_size=None) as ws:
            got = [message async for message in ws]
    assert got == [sized(n) for n in SIZES]


@given(st.integers(min_value=0, max_value=2**20))
def test_a_text_frame_head_is_what_websockets_writes(size):
    data = b"x" * size
    assert text_frame_head(size) + data == Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])


FRAMES = 300


def outbox_app(outcome: dict[str, Any], pushed: threading.Event) -> Any:
    """An outbox wired as ``Connection`` wires it (``direct`` from the protocol, a writer task that
    waits, takes and sends): pushes ``FRAMES`` numbered 1 KiB frames, letting the writer run after
    each, and counts the pushes that left nothing queued (written at once, past the writer)."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        outbox = Outbox()
        outbox.direct = scope["extensions"][WRITE_TEXT_NOW]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(write_outbox, outbox, scope["extensions"][SEND_TEXTS])
            outcome["direct"] = 0
            for n in range(FRAMES):
                outbox.push(Packet(n, f"{n:04d}" + "x" * 1020))
                outcome["direct"] += not outbox.frames and not outbox.bytes
                await anyio.lowlevel.checkpoint()  # the writer waits again if it sent all
            pushed.set()
            outbox.end("done")
        await send({"type": "websocket.close", "code": 1000})
    return asgi


async def write_outbox(outbox: Outbox, send_texts: Any) -> None:
    while True:
        await outbox.wait()
        packets = outbox.take()
        if not packets:
            return
        assert await send_texts([packet.text for packet in packets])
        outbox.sent(sum(packet.size for packet in packets))


async def test_an_outbox_writes_past_its_waiting_writer_and_queues_when_the_socket_pushes_back():
    """The client reads nothing until every frame was pushed: the first go straight to the socket,
    the rest wait in the outbox once the transport is past its high water; all arrive, in order."""
    outcome: dict[str, Any] = {}
    pushed = threading.Event()
    with run_server(outbox_app(outcome, pushed), ws=LingeringWebSocketProtocol) as running:
        async with connect(f"ws://{running.address}/", sock=small_window_socket(running.address),
                           max_queue=1, compression=None) as ws:
            assert await anyio.to_thread.run_sync(pushed.wait, 10)
            got = [message async for message in ws]
    assert [int(str(text)[:4]) for text in got] == list(range(FRAMES))
    assert 0 < outcome["direct"] < FRAMES  # some at once, the rest queued behind the full socket
