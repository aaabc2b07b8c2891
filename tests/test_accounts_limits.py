"""Per-user limits against a real server (``[auth] daily_tokens``, ``user_turns``, ``user_frame_rate``):
the daily budget counted from the store and shown to the meter (``budget`` frames), a message over it
refused and not stored, replies at once per user, and one frame bucket shared by a user's sockets;
another user is never held back by the first one's use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.accounts_support import add_users, cookie_header, http_as, sign_in
from tests.support import SHORT_REPLY, SLOW_DEMO, client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def limited(tmp_path: Path, providers: dict[str, Any] | None = None, **auth: Any):
    data: dict[str, Any] = {"auth": {"mode": "accounts", **auth}}
    if providers:
        data["providers"] = providers
    return settings_for(tmp_path, data)


async def test_limits_daily_budget_is_shown_spent_and_then_refused(tmp_path):
    settings = limited(tmp_path, daily_tokens=60)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        async with client(address, additional_headers=cookie_header(alice)) as c:
            await c.hello()
            first = (await c.until("budget"))[-1]
            spent, refused, turns = 0, None, []
            for n in range(10):
                turn = await c.say(f"echo turn {n}", id=f"m{n}")
                if turn[-1]["type"] == "error":
                    refused = turn[-1]
                    break
                done = turn[-1]
                spent += done["input_tokens"] + done["output_tokens"]
                turns.append((await c.until("budget"))[-1])
            sid = c.session_id
        async with http_as(address, alice) as http:
            stored = (await http.get(f"/api/sessions/{sid}")).json()["message_count"]
        async with client(address, additional_headers=cookie_header(bob)) as c:
            await c.hello()
            bobs = (await c.until("budget"))[-1]
            bob_turn = await c.say("echo bob is not held back")
    assert first == {**first, "tokens_left": 60, "daily_tokens": 60} and first["resets_at"].endswith("+00:00")
    assert turns[-1]["tokens_left"] == max(0, 60 - spent) == 0
    assert refused is not None and refused["code"] == "budget_exhausted"
    assert refused["message_id"] == f"m{len(turns)}"
    assert "tokens for today" in refused["message"]
    assert stored == 2 * len(turns)  # the refused message was not stored
    assert bobs["tokens_left"] == 60 and bob_turn[-1]["type"] == "done"


async def test_limits_replies_at_once_per_user(tmp_path):
    settings = limited(tmp_path, {"demo": SLOW_DEMO}, user_turns=1)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        async with client(address, additional_headers=cookie_header(alice)) as one, \
                client(address, additional_headers=cookie_header(alice)) as two, \
                client(address, additional_headers=cookie_header(bob)) as other:
            for c in (one, two, other):
                await c.hello()
            await one.start_turn(SHORT_REPLY)
            second = await two.say("echo a second reply at once", id="second")
            bobs = await other.start_turn(SHORT_REPLY)
            await one.until("done")
            third = await two.say("echo now it fits", id="third")
    assert second[-1]["type"] == "error" and second[-1]["code"] == "busy"
    assert "user_turns" in second[-1]["message"] and second[-1]["message_id"] == "second"
    assert of_type(bobs, "chunk") and third[-1]["type"] == "done"


async def test_limits_one_frame_bucket_for_all_of_a_users_sockets(tmp_path):
    settings = limited(tmp_path, user_frame_rate=0.01, user_frame_burst=4)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        async with client(address, additional_headers=cookie_header(alice)) as one, \
                client(address, additional_headers=cookie_header(alice)) as two, \
                client(address, additional_headers=cookie_header(bob)) as other:
            await one.hello()
            await two.hello()  # two of the user's four frames
            await one.send("stop")
            await one.send("stop")  # four
            await two.send("stop")  # a fifth, on the other socket: over the user's limit
            refused = await two.until("error")
            await other.hello()
            await other.send("stop")
            await other.send("stop")
            bobs = await other.say("echo his fourth frame")  # alice spent five: bob's bucket is his own
    assert refused[-1]["code"] == "rate_limited" and "over all your connections" in refused[-1]["message"]
    assert bobs[-1]["type"] == "done" and not of_type(bobs, "error")
