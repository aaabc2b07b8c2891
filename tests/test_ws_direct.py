"""The direct write of a batch of frames (``LingeringWebSocketProtocol.send_texts``, used by
``Connection.send_loop``): real uvicorn with meterchat's protocol, real websockets clients."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from server.web.app import create_app
from server.web.ws_guard import SEND_TEXTS, LingeringWebSocketProtocol, text_frame_head
from tests.support import client, run_server, settings_for, text_of

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
