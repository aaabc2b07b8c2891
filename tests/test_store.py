from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
import pytest

from server.errors import ConfigError, SessionExists, UnknownSession
from server.history.messages import ChatMessage, Image, ServedBy, ToolCall
from server.store.backends import open_store
from server.store.base import CallRecord, Clock, Store, StoredSession, message_to_data
from server.store.migrations import MIGRATIONS
from server.store.sqlite import FILE_NAME

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Backend:
    """One store backend under test: how to open it (again) and how to count rows behind its back."""

    name: str
    data_dir: Path
    url: str = ""

    def open(self) -> Store:
        return open_store(self.data_dir, self.url)

    def execute(self, sql: str) -> None:
        """Change rows behind the store's back (what another instance, or time, would have done)."""
        if not self.url:
            with sqlite3.connect(self.data_dir / FILE_NAME) as raw:
                raw.execute(sql)
            return
        with psycopg.connect(self.url) as raw:
            raw.execute(sql)

    def count(self, sql: str) -> int:
        if not self.url:
            with sqlite3.connect(self.data_dir / FILE_NAME) as raw:
                return int(raw.execute(sql).fetchone()[0])
        with psycopg.connect(self.url) as raw:
            row = raw.execute(sql).fetchone()
            assert row is not None
            return int(row[0])


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every store test runs on both backends; PostgreSQL on a fresh database of the private cluster."""
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path / "data")
    cluster = request.getfixturevalue("pg_cluster")
    return Backend("postgresql", tmp_path / "unused", cluster.new_database())


def every_field_messages() -> list[ChatMessage]:
    return [
        ChatMessage("system", "be brief"),
        ChatMessage("user", "[earlier turns omitted to fit the context window]", breadcrumb=True),
        ChatMessage("user", "summary of before", summary=True),
        ChatMessage("user", "look ✓", images=[Image("image/png", "aGVsbG8=")], turn_id="t1",
                    left_out="trimmed"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "search", {"q": "x", "n": [1, 2]})],
                    turn_id="t1", left_out="compacted", served_by=ServedBy("demo", "demo-small", "default")),
        ChatMessage("tool", "result", tool_call_id="c1", name="search", turn_id="t1",
                    images=[Image("image/jpeg", "/9j/")]),
        ChatMessage("assistant", "half a rep", turn_id="t1", interrupted=True,
                    served_by=ServedBy("openai", "gpt/4", "hint", "code")),
    ]


def as_data(messages: list[ChatMessage]) -> list[dict[str, object]]:
    return [message_to_data(message) for message in messages]


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    opened = backend.open()
    yield opened
    await opened.close()


async def test_store_round_trips_every_field_and_mark(store: Store) -> None:
    messages = every_field_messages()
    await store.create_session("s1", title="Title ✓", route="demo/demo-small")
    await store.append_messages("s1", messages)
    session = await store.get_session("s1")
    assert session is not None
    assert (session.id, session.title, session.route) == ("s1", "Title ✓", "demo/demo-small")
    assert as_data(session.messages) == as_data(messages)
    assert session.messages[4].tool_calls == messages[4].tool_calls
    assert session.messages[3].images == messages[3].images


async def test_store_get_unknown_session_is_none(store: Store) -> None:
    assert await store.get_session("nope") is None
    assert await store.get_summary("nope") is None


async def test_store_appends_keep_order_across_calls(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    first = [ChatMessage("user", f"a{i}") for i in range(3)]
    second = [ChatMessage("assistant", f"b{i}") for i in range(3)]
    await store.append_messages("s", first)
    await store.append_messages("s", second)
    session = await store.get_session("s")
    assert session is not None
    assert [m.content for m in session.messages] == ["a0", "a1", "a2", "b0", "b1", "b2"]


async def test_store_save_messages_upserts_by_id(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    user, reply = ChatMessage("user", "q"), ChatMessage("assistant", "")
    await store.append_messages("s", [user, reply])
    reply.set_content("partial answer")
    user.left_out = "trimmed"
    later = ChatMessage("user", "next")
    await store.save_messages("s", [reply, user, later])
    session = await store.get_session("s")
    assert session is not None
    assert [m.id for m in session.messages] == [user.id, reply.id, later.id]
    assert session.messages[0].left_out == "trimmed"
    assert session.messages[1].content == "partial answer"


async def test_store_checkpoints_after_the_first_rewrite_the_reply_in_place(store: Store) -> None:
    # A streaming reply's first checkpoint adds its row (the session touched); the later ones
    # rewrite that row and nothing else, until the reply's final save touches the session again.
    await store.create_session("s", title="t", route="r")
    await store.append_messages("s", [ChatMessage("user", "a question")])
    reply = ChatMessage("assistant", "first words", turn_id="t1", interrupted=True)
    await store.save_batch({"s": [reply]})
    first = await store.get_session("s")
    reply.set_content("first words, then more")
    await store.save_batch({"s": [reply]})
    later = await store.get_session("s")
    assert first is not None and later is not None and later.updated_at == first.updated_at
    assert [(m.content, m.interrupted) for m in later.messages] == [
        ("a question", False), ("first words, then more", True)]
    reply.set_content("first words, then more, and the end")
    reply.interrupted = False
    await store.save_messages("s", [reply])
    final = await store.get_session("s")
    assert final is not None and final.updated_at > first.updated_at
    assert [m.content for m in final.messages][-1] == "first words, then more, and the end"
    await store.delete_session("s")  # deleted while it streams: a checkpoint writes nothing
    await store.save_batch({"s": [reply]})
    assert await store.get_session("s") is None


async def test_store_save_messages_appends_an_unsaved_stream(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    reply = ChatMessage("assistant", "first chunk")
    await store.save_messages("s", [reply])
    reply.set_content("first chunk and more")
    await store.save_messages("s", [reply])
    session = await store.get_session("s")
    assert session is not None
    assert [m.content for m in session.messages] == ["first chunk and more"]


async def test_store_insert_message_lands_at_index(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    await store.append_messages("s", [ChatMessage("system", "sys"), ChatMessage("user", "u1")])
    await store.insert_message("s", 1, ChatMessage("user", "crumb", breadcrumb=True))
    await store.insert_message("s", 0, ChatMessage("system", "first"))
    await store.insert_message("s", 99, ChatMessage("assistant", "last"))
    session = await store.get_session("s")
    assert session is not None
    assert [m.content for m in session.messages] == ["first", "sys", "crumb", "u1", "last"]


async def test_store_insert_message_renumbers_when_floats_run_out(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    head = [ChatMessage("system", "sys0"), ChatMessage("system", "sys1"), ChatMessage("user", "end")]
    await store.append_messages("s", head)
    # Each insert at index 2 halves the gap above position 1.0; a double runs out after ~52.
    for i in range(80):
        await store.insert_message("s", 2, ChatMessage("user", str(i)))
    session = await store.get_session("s")
    assert session is not None
    expected = ["sys0", "sys1", *[str(i) for i in reversed(range(80))], "end"]
    assert [m.content for m in session.messages] == expected


async def test_store_list_sessions_newest_first_with_counts(store: Store) -> None:
    for name in ("a", "b", "c"):
        await store.create_session(name, title=name.upper(), route="r")
    await store.append_messages("a", [ChatMessage("user", "x"), ChatMessage("assistant", "y")])
    summaries = await store.list_sessions()
    assert [(s.id, s.message_count) for s in summaries] == [("a", 2), ("c", 0), ("b", 0)]
    assert summaries[0].title == "A"
    assert summaries[0].updated_at > summaries[0].created_at


async def test_store_rename_and_set_route(store: Store) -> None:
    await store.create_session("s", title="old", route="demo")
    await store.rename_session("s", "new")
    await store.set_route("s", "demo/demo-open")
    summary = await store.get_summary("s")
    assert summary is not None
    assert (summary.title, summary.route) == ("new", "demo/demo-open")


async def test_store_records_calls_in_order(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    first = CallRecord("t1", "demo", "demo-small", "default", 10, 5, "provider", 0.25)
    second = CallRecord("t2", "openai", "gpt", "hint", 20, 7, "estimate", None, "2020-01-01T00:00:00+00:00")
    await store.record_call("s", first)
    await store.record_call("s", second)
    session = await store.get_session("s")
    assert session is not None
    assert session.calls[1] == second
    assert session.calls[0].created_at is not None
    assert session.calls[0] == CallRecord(**{**first.__dict__, "created_at": session.calls[0].created_at})


async def test_store_saves_messages_and_their_calls_in_one_write(store: Store, backend: Backend) -> None:
    await store.create_session("s", title="t", route="r")
    await store.record_call("s", CallRecord("t0", "demo", "m", "default", 1, 1, "provider"))
    user, reply = ChatMessage("user", "q", id="u1"), ChatMessage("assistant", "a", id="a1")
    call = CallRecord("t1", "demo", "m", "default", 30, 4, "provider", 0.5)
    await store.save_messages("s", [user, reply], [call])
    await store.save_messages("s", [], [CallRecord("t2", "demo", "m", "default", 9, 0, "provider")])
    reply.content = "a, whole"
    await store.save_messages("s", [reply])  # an upsert alone records no call
    session = await store.get_session("s")
    assert session is not None
    assert [(m.id, m.content) for m in session.messages] == [("u1", "q"), ("a1", "a, whole")]
    assert [(c.turn_id, c.input_tokens, c.cost_usd) for c in session.calls] == [
        ("t0", 1, None), ("t1", 30, 0.5), ("t2", 9, None)]
    with pytest.raises(UnknownSession):  # nothing of a refused write is kept
        await store.save_messages("ghost", [ChatMessage("user", "x")], [call])
    assert backend.count("SELECT COUNT(*) FROM calls") == 3


async def test_store_touches_a_session_once_for_a_reply_and_its_calls(store: Store) -> None:
    # One touch per write: the reply and its calls share it (on PostgreSQL a round trip less).
    await store.create_session("s", title="t", route="r")
    touches = []

    class CountingClock(Clock):
        def now(self) -> str:
            touches.append(1)
            return super().now()

    store._clock = CountingClock()  # type: ignore[attr-defined]  # each touch reads the clock once
    await store.save_messages("s", [ChatMessage("assistant", "a", id="a1")],
                              [CallRecord("t1", "demo", "m", "default", 3, 1, "provider")])
    assert len(touches) == 1
    session = await store.get_session("s")
    listed = [item for item in await store.list_sessions() if item.id == "s"]
    assert session is not None and session.calls[0].created_at == listed[0].updated_at


async def test_store_delete_cascades_to_messages_and_calls(store: Store, backend: Backend) -> None:
    await store.create_session("s", title="t", route="r")
    await store.create_session("keep", title="t", route="r")
    await store.append_messages("s", every_field_messages())
    await store.append_messages("keep", [ChatMessage("user", "stays")])
    await store.record_call("s", CallRecord(None, "demo", "m", "default", 1, 1, "estimate"))
    await store.delete_session("s")
    assert await store.get_session("s") is None
    assert backend.count("SELECT COUNT(*) FROM messages WHERE session_id = 's'") == 0
    assert backend.count("SELECT COUNT(*) FROM calls") == 0
    assert backend.count("SELECT COUNT(*) FROM messages") == 1


async def test_store_keeps_trims_and_what_a_reload_draws(store: Store, backend: Backend) -> None:
    await store.create_session("s", title="t", route="r")
    at = "2026-11-29T10:00:00.000001+00:00"
    user = ChatMessage("user", "again", turn_id="t2", replaces="t1", created_at=at)
    reply = ChatMessage("assistant", "ok", turn_id="t2", thinking="hmm", created_at=at)
    await store.append_messages("s", [user, reply])
    during = {"reason": "turn_limit", "dropped_turns": 1, "message_ids": ["m0"], "turn_ids": ["t0"],
              "turn_id": "t2"}
    restore = {"reason": "turn_limit", "dropped_turns": 1, "turn_ids": ["t1"], "after_message_id": reply.id}
    user.left_out = "trimmed"
    await store.record_trim("s", during, [user])  # the trim and the marks it set, in one write
    await store.record_trim("s", restore)
    session = await store.get_session("s")
    assert session is not None
    assert [message_to_data(m) for m in session.messages] == [message_to_data(user), message_to_data(reply)]
    assert session.messages[0].left_out == "trimmed"
    assert [{k: v for k, v in t.items() if k != "created_at"} for t in session.trims] == [during, restore]
    assert all(t["created_at"] for t in session.trims)
    await store.delete_session("s")
    assert backend.count("SELECT COUNT(*) FROM trims") == 0


async def test_store_import_keeps_trims_and_notices_with_their_own_times(store: Store) -> None:
    trim = {"reason": "turn_limit", "dropped_turns": 1, "turn_ids": ["t0"], "turn_id": "t1",
            "created_at": "2024-01-01T00:00:01+00:00"}
    notice = {"type": "aborted", "turn_id": "t1", "after_message_id": None,
              "created_at": "2024-01-01T00:00:02+00:00"}
    later = {**notice, "turn_id": "t2", "created_at": "2024-01-01T00:00:03+00:00"}
    imported = StoredSession("s", "t", "r", "2024-01-01T00:00:00+00:00", "2024-01-01T00:00:03+00:00",
                             [ChatMessage("user", "hi", turn_id="t1")], [], [trim], [notice, later])
    await store.import_session(imported)
    session = await store.get_session("s")
    assert session is not None
    assert (session.trims, session.notices) == ([trim], [notice, later])


async def test_store_keeps_notices_in_order_with_their_own_times(store: Store, backend: Backend) -> None:
    await store.create_session("s", title="t", route="r")
    error = {"type": "error", "code": "provider_unavailable", "message": "down", "retryable": True,
             "turn_id": "t1", "after_message_id": "m1", "created_at": "2026-11-29T10:00:00.000001+00:00"}
    switch = {"type": "context", "reason": "switch", "provider": "demo", "model": "small",
              "estimated_tokens": 12, "after_message_id": None,
              "created_at": "2026-11-29T10:00:01.000001+00:00"}
    command = {"type": "command", "content": "/model demo/small", "after_message_id": None}
    for notice in (error, switch, command):
        await store.record_notice("s", notice)
    session = await store.get_session("s")
    assert session is not None
    assert session.notices[:2] == [error, switch]  # the time it happened, not the time it was written
    assert {k: v for k, v in session.notices[2].items() if k != "created_at"} == command
    assert session.notices[2]["created_at"]
    with pytest.raises(UnknownSession):
        await store.record_notice("ghost", command)
    await store.delete_session("s")
    assert backend.count("SELECT COUNT(*) FROM notices") == 0


async def test_store_unknown_session_writes_raise(store: Store) -> None:
    with pytest.raises(UnknownSession):
        await store.append_messages("ghost", [ChatMessage("user", "x")])
    with pytest.raises(UnknownSession):
        await store.rename_session("ghost", "t")
    with pytest.raises(UnknownSession):
        await store.delete_session("ghost")
    with pytest.raises(UnknownSession):
        await store.record_call("ghost", CallRecord(None, "p", "m", "default", 0, 0, "estimate"))
    assert await store.list_sessions() == []


async def test_store_create_existing_id_raises(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    with pytest.raises(SessionExists):
        await store.create_session("s", title="other", route="r")
    summary = await store.get_summary("s")
    assert summary is not None and summary.title == "t"


async def test_store_reopens_after_close(backend: Backend) -> None:
    messages = every_field_messages()
    first = backend.open()
    await first.create_session("s", title="t", route="r")
    await first.append_messages("s", messages)
    await first.close()
    second = backend.open()
    session = await second.get_session("s")
    await second.close()
    assert session is not None
    assert as_data(session.messages) == as_data(messages)


async def test_store_file_is_in_wal_mode(tmp_path: Path) -> None:
    store = open_store(tmp_path / "nested" / "dir")
    await store.close()
    with sqlite3.connect(tmp_path / "nested" / "dir" / FILE_NAME) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        # the newest migration's version (older meterchats read this row and refuse a newer file)
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(MIGRATIONS[-1].version,)]


# The version-1 messages table as the first release wrote it, spelled out, so a codec derived from
# ChatMessage that drifted from the files users already have fails here.
VERSION_1_MESSAGES = """CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT NOT NULL, route TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE messages (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id TEXT NOT NULL, position REAL NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    tool_calls TEXT, tool_call_id TEXT, images TEXT, name TEXT,
    breadcrumb INTEGER NOT NULL, summary INTEGER NOT NULL, trimmed INTEGER NOT NULL,
    excluded TEXT, interrupted INTEGER NOT NULL, turn_id TEXT, PRIMARY KEY (session_id, id));"""
VERSION_1_ROWS = [
    ("s", "m3", 3.0, "user", "look ✓", None, None, '[{"media_type": "image/png", "data": "aGVsbG8="}]',
     None, 0, 0, 1, None, 0, "t1"),
    ("s", "m4", 4.0, "assistant", "", '[{"id": "c1", "name": "search", "arguments": {"q": "x"}}]', None,
     None, None, 1, 1, 0, "compacted", 1, "t1"),
]


async def test_store_reads_a_version_1_file_and_writes_the_same_rows(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / FILE_NAME) as raw:
        raw.executescript(VERSION_1_MESSAGES)
        raw.execute("INSERT INTO sessions VALUES ('s', 't', 'r', '2024', '2024')")
        raw.executemany(f"INSERT INTO messages VALUES ({', '.join('?' * 15)})", VERSION_1_ROWS)
    store = open_store(tmp_path)
    session = await store.get_session("s")
    assert session is not None
    image, call = session.messages
    assert (image.id, image.images, image.breadcrumb, image.left_out is not None) == \
        ("m3", [Image("image/png", "aGVsbG8=")], False, True)
    assert (call.tool_calls, call.breadcrumb, call.summary, call.interrupted, call.left_out is not None) == \
        ([ToolCall("c1", "search", {"q": "x"})], True, True, True, True)
    await store.create_session("copy", title="t", route="r")
    await store.append_messages("copy", session.messages)
    await store.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as raw:
        rows = raw.execute("SELECT * FROM messages WHERE session_id = 'copy' ORDER BY position").fetchall()
    # The columns added since version 1 (created_at, replaces, thinking, served_by) follow, empty
    # on a version-1 message.
    added = (None, None, None, None)
    assert [row[1:2] + row[3:] for row in rows] == [row[1:2] + row[3:] + added for row in VERSION_1_ROWS]


async def test_store_refuses_a_newer_schema(tmp_path: Path) -> None:
    await open_store(tmp_path).close()
    with sqlite3.connect(tmp_path / FILE_NAME) as raw:
        raw.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ConfigError, match="schema 99"):
        open_store(tmp_path)


async def test_store_concurrent_appends_all_land(store: Store) -> None:
    await store.create_session("s", title="t", route="r")

    async def writer(name: str) -> None:
        for i in range(20):
            await store.append_messages("s", [ChatMessage("user", f"{name}{i}")])

    async with anyio.create_task_group() as group:
        for name in "abcd":
            group.start_soon(writer, name)
    session = await store.get_session("s")
    assert session is not None
    contents = [m.content for m in session.messages]
    assert sorted(contents) == sorted(f"{n}{i}" for n in "abcd" for i in range(20))
    for name in "abcd":  # each writer's own messages keep its order
        assert [c for c in contents if c[0] == name] == [f"{name}{i}" for i in range(20)]


CHILD = """
import sys, anyio
from server.history.messages import ChatMessage
from server.store.backends import open_store

async def main(folder, url):
    store = open_store(folder, url)
    await store.create_session("s", title="t", route="demo")
    reply = ChatMessage("assistant", "", id="reply")
    await store.save_messages("s", [reply])
    i = 0
    while True:
        i += 1
        await store.append_messages("s", [ChatMessage("user", f"m{i}", id=f"m{i}")])
        reply.set_content(reply.content + f"<{i}>")
        await store.save_messages("s", [reply])
        print(i, flush=True)

anyio.run(main, sys.argv[1], sys.argv[2])
"""


async def test_store_survives_sigkill_mid_stream(backend: Backend) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(backend.data_dir), backend.url],
                             stdout=subprocess.PIPE, env=env, text=True)
    assert child.stdout is not None
    last = 0
    while last < 300:
        line = child.stdout.readline()
        assert line, "the writer exited before it was killed"
        last = int(line)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    store = backend.open()
    session = await store.get_session("s")
    await store.close()
    assert session is not None
    ids = [m.id for m in session.messages]
    assert ids[0] == "reply"
    assert ids[1:last + 1] == [f"m{i}" for i in range(1, last + 1)]
    assert f"<{last}>" in session.messages[0].content
    assert session.messages[0].content.startswith("".join(f"<{i}>" for i in range(1, last + 1)))


async def test_store_keeps_a_nul_character_in_content(store: Store) -> None:
    await store.create_session("s", title="t", route="r")
    await store.append_messages("s", [ChatMessage("assistant", "before\x00after")])
    session = await store.get_session("s")
    assert session is not None
    assert session.messages[0].content == "before\x00after"


async def test_store_two_stores_on_one_database_share_a_session(store: Store, backend: Backend) -> None:
    """Two servers on one database: each sees the other's writes, and interleaved appends all land."""
    other = backend.open()
    await store.create_session("s", title="t", route="r")

    async def writer(opened: Store, name: str) -> None:
        for i in range(15):
            await opened.append_messages("s", [ChatMessage("user", f"{name}{i}")])

    async with anyio.create_task_group() as group:
        group.start_soon(writer, store, "a")
        group.start_soon(writer, other, "b")
    await other.rename_session("s", "renamed elsewhere")
    session = await store.get_session("s")
    await other.close()
    assert session is not None and session.title == "renamed elsewhere"
    contents = [m.content for m in session.messages]
    for name in "ab":
        assert [c for c in contents if c[0] == name] == [f"{name}{i}" for i in range(15)]
