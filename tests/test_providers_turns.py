"""The provider bounds seen from a client: whole turns through the real app against the fakes."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.fakes import Reply
from tests.support import client, of_type, serve, settings_for, text_of

pytestmark = pytest.mark.anyio

KEY = "sk-live-4f9aQ27xZk81bLm0PqRs"


def settings(tmp_path, fake, base_url=None, **extra):
    profile = {"kind": "openai", "base_url": base_url or fake.base_url, "model": "m1",
               "discover_window": False, **extra}
    return settings_for(tmp_path, {"providers": {"p": profile}})


async def test_emoji_split_across_deltas_reaches_the_client_whole(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["smile \ud83d", "\ude00 and a lone \udc00"]))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("hi")
            again = await c.say("again")
        async with client(address) as c2:
            history = of_type(await c2.hello(c.session_id), "history")
    assert frames[-1]["type"] == "done" and text_of(frames) == "smile 😀 and a lone \ufffd"
    assert frames[-1]["full_response"] == "smile 😀 and a lone \ufffd"
    assert again[-1]["type"] == "done"  # the session goes on
    assert "smile 😀" in json.dumps(history, ensure_ascii=False)


async def test_provider_error_frame_is_short_and_shows_no_key(tmp_path, fake_openai):
    host = fake_openai.base_url.split("://", 1)[1]
    fake_openai.enqueue(Reply(status=500, error=f"upstream said: key {KEY} rejected " + "trace " * 500))
    base_url = f"http://admin:hunter2-pw@{host}"
    with serve(settings(tmp_path, fake_openai, base_url=base_url)) as address:
        async with client(address) as c:
            await c.hello()
            error = (await c.say("hi"))[-1]
            seen = json.dumps(c.frames)
    assert error["type"] == "error" and error["code"] == "unavailable"
    assert error["message"].startswith("p: HTTP 500: upstream said: key sk-") and len(error["message"]) <= 300
    assert KEY not in seen and KEY[8:] not in seen and "hunter2-pw" not in seen


async def test_provider_sending_only_keepalives_ends_the_turn(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["partial"], ending="close", keepalive=0.02))
    with serve(settings(tmp_path, fake_openai, idle_timeout_seconds=0.3)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("hi")
    assert text_of(frames) == "partial"
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "unavailable" and frames[-1]["retryable"]


async def test_second_stream_past_max_connections_is_overloaded(tmp_path, fake_openai):
    hold = threading.Event()
    fake_openai.enqueue(Reply(text=["first"], hold=hold))
    with serve(settings(tmp_path, fake_openai, max_connections=1, pool_timeout_seconds=0.2)) as address:
        async with client(address) as first, client(address) as second:
            await first.hello()
            await second.hello()
            try:
                await first.start_turn("one")
                refused = (await second.say("two"))[-1]
            finally:
                hold.set()
            done = await first.until("done", "error")
    assert refused["type"] == "error" and refused["code"] == "overloaded" and refused["retryable"]
    assert done[-1]["type"] == "done" and done[-1]["full_response"] == "first"


async def held_answer(c: Any, hold: threading.Event, message_id: str, content: str) -> list[dict[str, Any]]:
    """Send a message whose answer the fake holds until the client has the call's ``route`` frame
    and the frame after it; then the turn's frames to its end."""
    await c.send("message", id=message_id, content=content)
    try:
        frames: list[dict[str, Any]] = await c.until("route")
        frames.append(await c.recv())
    finally:
        hold.set()
    return frames + await c.until("done", "error")


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] if f["type"] != "context" else f"context:{f['reason']}" for f in frames]


async def test_a_calls_route_and_meter_come_while_the_provider_has_not_answered(tmp_path, fake_openai):
    """They are emitted once the request has left (ProviderRequest.sent), not at the first event:
    the provider here answers nothing until the client holds both frames."""
    hold = threading.Event()
    fake_openai.enqueue(Reply(text=[], hold=hold))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await held_answer(c, hold, "m1", "hi")
    [route] = of_type(frames, "route")
    sent = [f for f in of_type(frames, "context") if f["reason"] == "send"]
    assert route["turn_id"] == frames[0]["turn_id"] and len(sent) == 1
    assert frames.index(route) + 1 == frames.index(sent[0]) < len(frames) - 1
    assert frames[-1]["type"] == "done" and len(fake_openai.requests) == 1


@contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: a connection to it is refused for as long as it is held."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_a_call_that_cannot_connect_shows_its_route_and_meter_before_the_error(tmp_path, fake_openai):
    with socket_closed_port() as port:
        with serve(settings(tmp_path, fake_openai, base_url=f"http://127.0.0.1:{port}/v1")) as address:
            async with client(address) as c:
                await c.hello()
                frames = await c.say("hi")
    assert kinds(frames)[-3:] == ["route", "context:send", "error"]
    assert frames[-1]["code"] == "unavailable"


async def test_a_trimming_turns_frames_keep_their_order_and_come_before_the_answer(tmp_path, fake_openai):
    """The trim's frames are deferred with the call's (Session.defer_frames) and sent, in order,
    once the request has left: all of them while the provider still holds its answer."""
    profile = {"kind": "openai", "base_url": fake_openai.base_url, "model": "m1", "discover_window": False}
    data = settings_for(tmp_path, {"providers": {"p": profile}, "runtime": {"max_history_messages": 1}})
    hold = threading.Event()
    with serve(data) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("one")
            fake_openai.enqueue(Reply(text=[], hold=hold))  # no answer until the client has them
            frames = await held_answer(c, hold, "m2", "two")
    assert kinds(frames)[:5] == ["accepted", "history_trimmed", "context:trim", "route", "context:send"]
    assert kinds(frames)[5:] == ["context:usage", "context:done", "done"]
    assert [f["seq"] for f in frames] == sorted(f["seq"] for f in frames)
