from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.errors import ImportRejected
from server.history.messages import ChatMessage
from server.store.backends import open_store
from server.store.base import CallRecord, StoredSession, message_to_data
from server.web.export import from_json, to_json
from server.web.markdown import to_markdown
from tests.support import SHORT_REPLY, SLOW_DEMO, client, serve, settings_for
from tests.test_reload import reopened
from tests.test_store import every_field_messages

pytestmark = pytest.mark.anyio


TRIM = {"dropped_messages": 2, "dropped_turns": 1, "kept_turns": 1, "reason": "token_budget",
        "token_budget": 4096, "tokens_before": 4626, "tokens_after": 3546, "message_ids": ["m1", "m2"],
        "turn_ids": ["t0"], "turn_id": "t1", "created_at": "2024-01-01T00:00:01+00:00"}
NOTICES = [
    {"type": "error", "code": "provider_unavailable", "message": "down", "retryable": True, "turn_id": "t1",
     "route": {"provider": "demo", "model": "demo-small", "route_kind": "default"},
     "created_at": "2024-01-01T00:00:02+00:00", "after_message_id": "m3"},
    {"type": "context", "provider": "demo", "model": "demo-open", "route_kind": "switch",
     "estimated_tokens": 95, "tokens_source": "estimate", "context_token_budget": 32000, "reason": "switch",
     "trim_preview": {"turns": 1, "tokens": 20}, "calibration_ratio": 0.9,
     "created_at": "2024-01-01T00:00:03+00:00", "after_message_id": None},
    {"type": "command", "content": "/model demo", "created_at": "2024-01-01T00:00:04+00:00"},
]


def sample_session() -> StoredSession:
    messages = every_field_messages()
    messages.append(ChatMessage("tool", "has ``` a fence", tool_call_id="c2", name="shell"))
    day1, day2 = "2024-01-01T00:00:00+00:00", "2024-01-02T00:00:00+00:00"
    calls = [CallRecord("t1", "demo", "demo-small", "default", 12, 3, "provider", 0.5, day1),
             CallRecord(None, "openai", "gpt", "hint", 1, 0, "estimate", None, day2)]
    return StoredSession("abc", "Chat ✓", "demo/demo-small", "2024-01-01T00:00:00+00:00",
                         "2024-01-02T00:00:00+00:00", messages, calls, [TRIM], copy.deepcopy(NOTICES))


def test_export_json_is_versioned_and_plain_data() -> None:
    document = to_json(sample_session())
    assert (document["format"], document["version"]) == ("meterchat.session", 1)
    assert json.loads(json.dumps(document)) == document
    assert document["messages"][4]["excluded"] == "compacted"
    # the version-1 keys, in the order a file written by the first release has them, then the
    # optional keys added since (a version-1 reader ignores them; a version-1 file reads without them)
    assert list(document["messages"][0]) == [
        "id", "role", "content", "tool_calls", "tool_call_id", "images", "name", "breadcrumb", "summary",
        "trimmed", "excluded", "interrupted", "turn_id", "created_at", "replaces",
        "thinking", "served_by"]
    assert list(document["calls"][0]) == [
        "turn_id", "provider", "model", "route_kind", "input_tokens", "output_tokens", "tokens_source",
        "cost_usd", "created_at"]
    assert document["calls"][0]["cost_usd"] == 0.5


def test_export_json_round_trip_gives_a_new_id_and_equal_content() -> None:
    session = sample_session()
    imported = from_json(json.loads(json.dumps(to_json(session))))
    assert imported.id != session.id
    assert (imported.title, imported.route, imported.created_at) == (session.title, session.route,
                                                                     session.created_at)
    assert [message_to_data(m) for m in imported.messages] == [message_to_data(m) for m in session.messages]
    assert imported.calls == session.calls
    assert (imported.trims, imported.notices) == ([TRIM], NOTICES)


async def test_export_import_through_the_store(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    session = sample_session()
    await store.import_session(from_json(to_json(session)))
    await store.import_session(from_json(to_json(session)))  # twice: two sessions, nothing overwritten
    summaries = await store.list_sessions()
    stored = await store.get_session(summaries[0].id)
    await store.close()
    assert len(summaries) == 2 and summaries[0].id != summaries[1].id
    assert stored is not None
    assert [message_to_data(m) for m in stored.messages] == [message_to_data(m) for m in session.messages]
    assert stored.calls == session.calls


def test_export_markdown_names_every_message_and_mark() -> None:
    session = sample_session()
    text = to_markdown(session)
    assert text.startswith("# Chat ✓\n")
    assert "`demo/demo-small`" in text
    for index, message in enumerate(session.messages, 1):
        assert f"## {index}. {message.role.capitalize()}" in text
        assert message.content in text
    assert "## 4. User _(trimmed, no longer sent)_" in text
    assert "_(excluded: compacted)_" in text
    assert "_(interrupted)_" in text and "_(breadcrumb)_" in text and "_(summary)_" in text
    assert '```json\n{\n  "q": "x",' in text
    assert "**Tool result** `search` (call `c1`)\n\n```text\nresult\n```" in text
    assert "````text\nhas ``` a fence\n````" in text  # the fence outgrows the content's backticks
    assert "| t1 | demo/demo-small | default | 12 | 3 | provider | 0.500000 |" in text


def test_export_markdown_of_an_empty_session() -> None:
    text = to_markdown(StoredSession("x", "", "demo", "c", "u"))
    assert text.startswith("# Untitled session\n") and "---" not in text


def bad(mutate: Any) -> str:
    document = copy.deepcopy(to_json(sample_session()))
    mutate(document)
    with pytest.raises(ImportRejected) as caught:
        from_json(document)
    assert caught.value.code == "import_rejected"
    return caught.value.message


def test_import_rejects_bad_fields_naming_them() -> None:
    assert bad(lambda d: d.update(format="other")).startswith("format:")
    assert bad(lambda d: d.update(version=2)).startswith("version:")
    assert bad(lambda d: d.pop("route")) == "route: required"
    assert bad(lambda d: d.update(messages={})) == "messages: expected array, got object"
    assert bad(lambda d: d["messages"][2].update(role="robot")).startswith("messages[2].role:")
    assert bad(lambda d: d["messages"][1].pop("content")) == "messages[1].content: required"
    assert bad(lambda d: d["messages"][0].update(trimmed=1)) == \
        "messages[0].trimmed: expected boolean, got integer"
    assert bad(lambda d: d["messages"][3].update(colour="red")) == "messages[3].colour: unknown field"
    assert bad(lambda d: d["messages"][4]["tool_calls"][0].update(arguments="x")) == \
        "messages[4].tool_calls[0].arguments: expected object, got string"
    assert bad(lambda d: d["messages"][3]["images"][0].pop("data")) == "messages[3].images[0].data: required"
    assert bad(lambda d: d["messages"][2].update(served_by="demo")) == \
        "messages[2].served_by: expected object or null, got string"
    assert bad(lambda d: d["messages"][2].update(served_by={"provider": "demo", "model": 7,
                                                            "route_kind": "default"})) == \
        "messages[2].served_by.model: expected string, got integer"
    assert bad(lambda d: d["messages"][2].update(served_by={"provider": "demo", "model": "m"})) == \
        "messages[2].served_by.route_kind: required"
    assert bad(lambda d: d["messages"][5].update(id=d["messages"][0]["id"])).startswith(
        "messages[5].id: duplicate")
    assert bad(lambda d: d["calls"][1].update(input_tokens=True)) == \
        "calls[1].input_tokens: expected integer, got boolean"
    assert bad(lambda d: d["calls"][0].update(output_tokens=-1)).startswith("calls[0].output_tokens:")


def test_import_rejects_bad_trims_and_notices_naming_the_field() -> None:
    assert bad(lambda d: d.update(trims={})) == "trims: expected array or null, got object"
    assert bad(lambda d: d["trims"][0].pop("dropped_turns")) == "trims[0].dropped_turns: required"
    assert bad(lambda d: d["trims"][0].pop("created_at")) == "trims[0].created_at: required"
    assert bad(lambda d: d["trims"][0].update(reason="whim")).startswith("trims[0].reason: expected one of")
    assert bad(lambda d: d["trims"][0].update(message_ids=["m1", 2])) == \
        "trims[0].message_ids[1]: expected string, got integer"
    assert bad(lambda d: d["trims"][0].update(tokens_after="3,546")) == \
        "trims[0].tokens_after: expected integer, got string"
    assert bad(lambda d: d["notices"].append("hi")) == "notices[3]: expected an object, got string"
    assert bad(lambda d: d["notices"][0].update(type="chunk")).startswith(
        "notices[0].type: expected one of error,")
    assert bad(lambda d: d["notices"][0].update(retryable="yes")) == \
        "notices[0].retryable: expected boolean, got string"
    assert bad(lambda d: d["notices"][0].pop("message")) == "notices[0].message: required"
    assert bad(lambda d: d["notices"][0]["route"].update(model=None)) == \
        "notices[0].route.model: expected string, got null"
    assert bad(lambda d: d["notices"][1].update(reason="send")).startswith(
        "notices[1].reason: expected one of")
    assert bad(lambda d: d["notices"][1]["trim_preview"].pop("turns")) == \
        "notices[1].trim_preview.turns: required"
    assert bad(lambda d: d["notices"][2].update(colour="red")) == "notices[2].colour: unknown field"


@pytest.mark.parametrize("document", [None, [], "text", 3])
def test_import_rejects_a_document_that_is_not_an_object(document: Any) -> None:
    with pytest.raises(ImportRejected, match="^document: expected an object"):
        from_json(document)


def test_import_accepts_a_minimal_document() -> None:
    session = from_json({"format": "meterchat.session", "version": 1, "title": "t", "route": "demo",
                         "messages": [{"id": "m1", "role": "user", "content": "hi"}]})
    assert [(m.id, m.role, m.content, m.left_out, m.tool_calls) for m in session.messages] == \
        [("m1", "user", "hi", None, None)]
    assert session.calls == []


async def test_an_imported_session_reloads_with_its_trims_and_notices(tmp_path: Path) -> None:
    """Export a session with every kind of line over REST, import it, open the copy: its history
    frame has the same trims and notices, in the same places (message ids travel with the file)."""
    settings = settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO},
                                       "runtime": {"max_history_messages": 1}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("echo one")
            await c.send("message", id="bare", content="/model")
            await c.until("notice")  # the routes there are, not a turn
            await c.say("/hint nothing echo two")
            await c.say("echo three")
            await c.send("switch_model", route="demo/demo-open")
            await c.until("context")
            await c.start_turn(SHORT_REPLY, "q9")
            await c.send("stop")
            await c.until("aborted")
        original = await reopened(address, c.session_id)
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            exported = (await http.get(f"/api/sessions/{c.session_id}/export?format=json")).json()
            markdown = (await http.get(f"/api/sessions/{c.session_id}/export?format=md")).text
            copy_id = (await http.post("/api/sessions/import", json=exported)).json()["session_id"]
        imported = await reopened(address, copy_id)
    kinds = [n["type"] for n in original["notices"]]
    assert kinds == ["command", "notice", "notice", "route", "context", "aborted"]
    assert len(original["trims"]) == 3
    assert original["notices"][-1]["route"]["model"] == "demo-open"  # a stop keeps its route
    assert (imported["trims"], imported["notices"]) == (original["trims"], original["notices"])
    assert [m["id"] for m in imported["messages"]] == [m["id"] for m in original["messages"]]
    lines = [line for line in markdown.splitlines() if line.startswith("> ")]
    assert [line.split()[1] for line in lines] == [  # each where it happened, a trim above its turn
        "**Command**", "**Notice**", "_Trimmed:", "**Notice**", "**Hint**", "_Trimmed:", "**Switched**",
        "_Trimmed:", "**Stopped**"]
    assert "> _Trimmed: 1 turn dropped (over the turn limit)_" in lines
    assert markdown.index("## 8. Assistant _(interrupted)_") < markdown.index("> **Stopped**")
