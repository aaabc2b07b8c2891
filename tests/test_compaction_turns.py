"""Group compaction in real turns: truncation marks groups, summarization asks the route's model and
rolls back when that fails."""

from __future__ import annotations

import pytest

from server.history.compaction import SUMMARY_PREFIX
from server.history.messages import BREADCRUMB_TEXT, ChatMessage, estimate_history_tokens
from tests.fakes import Reply
from tests.fakes.base import words
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def settings(tmp_path, fake, strategy):
    return settings_for(tmp_path, {
        "providers": {"p": {"kind": "openai", "base_url": fake.base_url, "model": "m", "tools": False}},
        "runtime": {"compaction": {"strategy": strategy, "tokens_exceed": 600,
                                   "minimum_preserved_groups": 2}},
    })


def summarizing(fail: bool):
    def reply(body):
        text = str(body["messages"])
        if "Summarise the earlier conversation" in text:
            return Reply(status=500, error="summary model down") if fail else Reply(text=["User likes tea."])
        return Reply(text=words("noted " * 40))
    return reply


async def test_truncation_excludes_old_groups_and_keeps_them(tmp_path, fake_openai):
    fake_openai.default = summarizing(False)
    with serve(settings(tmp_path, fake_openai, "truncation")) as address:
        async with client(address) as c:
            await c.hello()
            trims = []
            for n in range(6):
                trims += of_type(await c.say(f"message {n} " + "tea " * 60), "history_trimmed")
        async with client(address) as d:
            snapshot = (await d.hello(c.session_id))[1]
            history = snapshot["messages"]
    stored_only = ("created_at", "after_message_id")
    kept = [{k: v for k, v in t.items() if k not in stored_only} for t in snapshot["trims"]]
    live = [{k: v for k, v in t.items() if k not in ("type", "seq")} for t in trims]
    assert kept == live  # compaction's notices come back on a reload, as the budget trim's do
    # Seed 004: groups go until the count no longer exceeds the trigger.
    assert trims and all(t["reason"] == "compaction" for t in trims)
    # Seed 004, in the planner's raw units (the notice shows the meter's figures): the first
    # request after the compaction, its breadcrumb aside, no longer exceeds the trigger.
    compacted = next(r.json["messages"] for r in fake_openai.requests if BREADCRUMB_TEXT in str(r.json))
    assert estimate_history_tokens([ChatMessage(m["role"], m["content"]) for m in compacted
                                    if m["content"] != BREADCRUMB_TEXT]) <= 600
    excluded = [m for m in history if m.get("excluded")]
    assert excluded and len(history) == 12
    for request in fake_openai.requests:
        first = [m for m in request.json["messages"] if m["role"] != "system"][0]
        assert first["role"] == "user"


async def test_summarization_replaces_old_groups_with_a_summary(tmp_path, fake_openai):
    fake_openai.default = summarizing(False)
    with serve(settings(tmp_path, fake_openai, "summarization")) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(6):
                frames = await c.say(f"message {n} " + "tea " * 60)
                assert frames[-1]["type"] == "done"
    sent = [r.json["messages"] for r in fake_openai.requests]
    summarized = [m for m in sent if any(SUMMARY_PREFIX in str(x.get("content")) for x in m)]
    assert summarized
    assert "User likes tea." in str(summarized[-1])
    assert "earlier turns omitted" not in str(summarized[-1])


async def test_summarization_failure_rolls_back_and_the_turn_goes_on(tmp_path, fake_openai):
    fake_openai.default = summarizing(True)
    with serve(settings(tmp_path, fake_openai, "summarization")) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(5):
                frames = await c.say(f"message {n} " + "tea " * 60)
                assert frames[-1]["type"] == "done"
                assert not of_type(frames, "history_trimmed")
    last = fake_openai.requests[-1].json["messages"]
    assert "message 0" in str(last) and SUMMARY_PREFIX not in str(last)


async def test_compaction_notice_reads_as_the_meter_before_and_after(tmp_path, fake_openai):
    """Tool schemas, the reply reserve and the provider's counts make the meter's figure differ from
    the raw estimate; compaction's notice must show the meter's figures, not the raw ones."""
    fake_openai.default = summarizing(False)
    data = {"providers": {"p": {"kind": "openai", "base_url": fake_openai.base_url, "model": "m"}},
            "runtime": {"reply_reserve_tokens": 200,
                        "compaction": {"strategy": "truncation", "tokens_exceed": 600,
                                       "minimum_preserved_groups": 2}}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            await c.hello()
            frames = []
            for n in range(6):
                frames += await c.say(f"message {n} " + "tea " * 60)
    notices = [i for i, f in enumerate(frames) if f["type"] == "history_trimmed"]
    assert notices
    for i in notices:
        notice, meter = frames[i], frames[i + 1]
        assert meter["type"] == "context" and meter["reason"] == "trim"
        assert notice["tokens_after"] == meter["estimated_tokens"]  # what the meter shows after
        previous = [f for f in frames[:i] if f["type"] == "context"][-1]
        # the meter before it showed the last send; the new message only adds to that
        assert notice["tokens_before"] > previous["estimated_tokens"]
        assert notice["tokens_after"] < notice["tokens_before"]
        assert notice["token_budget"] < notice["tokens_before"]
