"""Versions of a turn over a real socket: retry_of and edit_of, what they set aside, what every tab
and a reload learn of them (replaces, turns_set_aside), the edit preview and the timestamps."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support import Client, client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def turn_of(frames: list[dict[str, Any]]) -> str:
    turn: str = of_type(frames, "accepted")[0]["turn_id"]
    return turn


def users(history: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(m["turn_id"], m.get("replaces"), m.get("excluded")) for m in history["messages"]
            if m["role"] == "user"]


async def three_turns(c: Client) -> list[str]:
    await c.hello()
    return [turn_of(await c.say(f"echo {word}")) for word in ("one", "two", "three")]


async def edit_preview(c: Client) -> dict[str, Any]:
    """The next context frame answering preview_edit (another tab's hello sends its own meter)."""
    while True:
        frame = (await c.until("context"))[-1]
        if frame["reason"] == "edit_preview":
            return frame


async def test_retry_of_is_echoed_and_every_tab_learns_the_set_aside(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as a, client(address) as b:
            await a.hello()
            turn = turn_of(await a.say("echo one"))
            await b.hello(a.session_id)
            frames = await a.say("echo one", retry_of=turn)  # a regenerate: the same text
            seen = await b.until("done")
    assert of_type(frames, "accepted")[0]["retry_of"] == turn
    for got in (frames, seen):
        aside = of_type(got, "turns_set_aside")
        assert [(f["turn_ids"], f["reason"]) for f in aside] == [([turn], "replaced by a regenerated reply")]
        assert aside[0]["seq"] < of_type(got, "accepted")[0]["seq"]


async def test_replaces_survives_a_restart(tmp_path):
    settings = settings_for(tmp_path)
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            turn = turn_of(await c.say("echo one"))
            again = turn_of(await c.say("echo two", retry_of=turn))
            session_id = c.session_id
    with serve(settings) as address:  # a restarted server: the store alone remembers
        async with client(address) as c:
            history = (await c.hello(session_id))[1]
    # another text in the replaced turn's place: an edit of the last message
    assert users(history) == [(turn, None, "replaced by an edit"), (again, turn, None)]


async def test_edit_of_sets_aside_that_turn_and_every_later_one(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            one, two, three = await three_turns(c)
            frames = await c.say("echo TWO", edit_of=two)
            async with client(address) as other:
                history = (await other.hello(c.session_id))[1]
    aside = of_type(frames, "turns_set_aside")
    assert [(f["turn_ids"], f["reason"]) for f in aside] == [([two, three], "replaced by an edit")]
    accepted = of_type(frames, "accepted")[0]
    assert accepted["edit_of"] == two and "retry_of" not in accepted
    edited = accepted["turn_id"]
    assert users(history) == [(one, None, None), (two, None, "replaced by an edit"),
                              (three, None, "replaced by an edit"), (edited, two, None)]
    replies = [m for m in history["messages"] if m["role"] == "assistant"]
    assert [m.get("excluded") for m in replies] == [None, "replaced by an edit", "replaced by an edit", None]


async def test_edit_of_refuses_an_unknown_turn_and_both_fields(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            one, _, _ = await three_turns(c)
            unknown = await c.say("echo x", id="m-x", edit_of="nope")
            both = await c.say("echo y", id="m-y", edit_of=one, retry_of=one)
            still = await c.say("echo z")
    assert [f["code"] for f in of_type(unknown + both, "error")] == ["bad_frame", "bad_frame"]
    assert [f.get("message_id") for f in of_type(unknown + both, "error")] == ["m-x", "m-y"]
    assert not of_type(unknown + both, "turns_set_aside")
    assert of_type(still, "done")  # nothing was set aside: the session goes on


async def test_preview_edit_shows_the_drop_for_the_asking_client_only(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c, client(address) as watcher:
            one, two, _ = await three_turns(c)
            await watcher.hello(c.session_id)
            await c.send("preview_edit", turn_id=two)
            preview = await edit_preview(c)
            await c.send("preview_edit", turn_id=one)
            all_gone = await edit_preview(c)
            await c.send("preview_edit", turn_id="nope")
            refused = (await c.until("error"))[-1]
            frames = await c.say("echo after")  # the preview changed nothing
            seen = await watcher.until("done")
    assert preview["reason"] == all_gone["reason"] == "edit_preview"
    assert all_gone["estimated_tokens"] < preview["estimated_tokens"]
    hello_meter = of_type(frames, "context")[0]  # the send's meter reads the whole history again
    assert hello_meter["estimated_tokens"] > preview["estimated_tokens"]
    assert preview["seq"] == refused["seq"]  # a local answer does not advance the session's seq
    assert refused["code"] == "bad_frame"
    assert not [f for f in of_type(seen, "context") if f["reason"] == "edit_preview"]
    assert not of_type(frames, "turns_set_aside")


async def test_timestamps_on_accepted_done_and_history(tmp_path):
    before = datetime.now(UTC)
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("echo hi")
            async with client(address) as other:
                history = (await other.hello(c.session_id))[1]
    after = datetime.now(UTC)
    accepted, done = of_type(frames, "accepted")[0], of_type(frames, "done")[0]
    stamps = [datetime.fromisoformat(s) for s in (accepted["created_at"], done["created_at"])]
    assert before <= stamps[0] <= stamps[1] <= after
    assert [m["created_at"] for m in history["messages"]] == [accepted["created_at"], done["created_at"]]
