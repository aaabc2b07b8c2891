"""The transcript's other lines come back on a reload, over a real server and socket: a turn's error
(code, message, retryable, and the route its failed call had), a notice, a switch's confirmation, a
typed /model command and a hinted route, each with the message it followed; kept in memory at once
and in the store for a restarted server."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from server.sessions.notices import NOTICES_SHOWN, Notices
from server.store.backends import open_store
from tests.fakes import Reply
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio
LIVE_ONLY = ("seq",)
STORED_ONLY = ("created_at", "after_message_id")


def settings(tmp_path, fake):
    return settings_for(tmp_path, {"providers": {
        "p": {"kind": "openai", "base_url": fake.base_url, "model": "m", "tools": False,
              "context_window": 8000, "models": {"small": 4000}},
    }})


def live(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in LIVE_ONLY}


def stored(notice: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in notice.items() if k not in STORED_ONLY}


async def reopened(address: str, session_id: str | None) -> dict[str, Any]:
    async with client(address) as tab:
        history: dict[str, Any] = (await tab.hello(session_id))[1]
    return history


async def test_a_turn_error_comes_back_after_the_message_it_followed(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["fine"]), Reply(status=503, error="overloaded, try later"))
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("first", id="m1")
            frames = await c.say("second", id="m2")
            error, call = frames[-1], of_type(frames, "route")[-1]
        cached = await reopened(address, c.session_id)
    with serve(settings(tmp_path, fake_openai)) as address:  # a restarted server reads the store
        restored = await reopened(address, c.session_id)
    assert error["type"] == "error" and error["retryable"] and error["turn_id"]
    for history in (cached, restored):
        (notice,) = history["notices"]
        # the failed call's route, with when it began: the failed reply's time after a reload
        route = {"provider": "p", "model": "m", "route_kind": "default", "created_at": call["created_at"]}
        assert stored(notice) == {**live(error), "route": route}
        assert notice["after_message_id"] == "m2" and notice["created_at"]


async def test_switch_command_and_notices_come_back_in_order(tmp_path, fake_openai):
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="c1", content="/model p/small")  # before the first message
            switched = (await c.until("context"))[-1]
            await c.say("hello", id="m1")
            await c.send("message", id="c2", content="/model nowhere")
            unknown = (await c.until("notice"))[-1]
            await c.send("switch_model", route="p/m")
            back = (await c.until("context"))[-1]
    with serve(settings(tmp_path, fake_openai)) as address:
        history = await reopened(address, c.session_id)
    notices = history["notices"]
    assert [stored(n) for n in notices] == [
        {"type": "command", "content": "/model p/small"}, live(switched),
        {"type": "command", "content": "/model nowhere"}, live(unknown), live(back)]
    assert switched["reason"] == "switch" and unknown["code"] == "unknown_route"
    assert [n["after_message_id"] for n in notices] == [None, None, *[history["messages"][-1]["id"]] * 3]


async def test_a_failed_turn_is_not_a_notice_of_another_socket(tmp_path, fake_openai):
    """A refusal answers one socket (a busy session, a bad frame): it is not drawn in the session."""
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("hello", id="m1")
            await c.send("message", id="m1", content="again")  # a resend: ignored
            await c.send("message", id="m9", content="x", retry_of="no-such-turn")
            refusal = (await c.until("error"))[-1]
        history = await reopened(address, c.session_id)
    assert refusal["code"] == "bad_frame" and "turn_id" not in refusal
    assert of_type(history.get("notices") or [], "error") == []


async def test_a_hinted_route_is_kept_and_a_plain_turn_keeps_nothing(tmp_path, fake_openai):
    """The reply's "served by ... hint" comes back (the calls the store records carry no hint); a turn
    with nothing but its reply costs no notice write."""
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            plain = await c.say("hello", id="m1")
            hinted = await c.say("/hint nowhere tell me", id="m2")
    with serve(settings(tmp_path, fake_openai)) as address:
        history = await reopened(address, c.session_id)
    assert plain[-1]["type"] == "done" and hinted[-1]["type"] == "done"
    route = of_type(hinted, "route")[0]
    unknown = of_type(hinted, "notice")[0]
    assert route["hint"] == "nowhere" and unknown["code"] == "unknown_hint"
    assert sorted(map(stored, history["notices"]), key=lambda n: n["type"]) == \
        sorted([live(unknown), stored(live(route))], key=lambda n: n["type"])
    kept_route = of_type(history["notices"], "route")[0]
    assert kept_route["created_at"] == route["created_at"]  # the frame's own time, not the write's
    assert {n["after_message_id"] for n in history["notices"]} == {"m2"}


def test_a_session_keeps_its_newest_notices_in_memory():
    notices = Notices([{"type": "notice", "n": n} for n in range(NOTICES_SHOWN + 5)])
    assert [n["n"] for n in notices.kept] == list(range(5, NOTICES_SHOWN + 5))
    for n in range(3):
        notices.observe({"type": "notice", "code": "x", "message": str(n), "seq": 9}, "m1", "now")
    notices.observe({"type": "chunk", "turn_id": "t", "content": "x"}, "m1", "now")  # not a line
    assert len(notices.kept) == NOTICES_SHOWN and len(notices.unsaved) == 3
    assert notices.kept[-1] == {"type": "notice", "code": "x", "message": "2", "created_at": "now",
                                "after_message_id": "m1"}


async def test_notices_saved_by_two_writers_at_once_are_written_once_in_order(tmp_path):
    """A switch can be saved while a turn's end saves: each notice is written once, in order."""
    store = open_store(tmp_path)
    await store.create_session("s", title="t", route="r")
    notices = Notices()
    for n in range(5):
        notices.observe({"type": "notice", "code": "x", "message": str(n)}, None, "now")
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(notices.save, store, "s")
    stored_session = await store.get_session("s")
    assert stored_session is not None
    assert [n["message"] for n in stored_session.notices] == ["0", "1", "2", "3", "4"]
    assert notices.unsaved == []
    await store.close()
