"""Sessions without clutter (issue 10): a session is stored with its first message, and the session
list pages and is searched by title and text (SQLite FTS5)."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from server.history.messages import ChatMessage
from server.store.backends import open_store
from tests.support import client, serve, settings_for
from tests.test_store import Backend

pytestmark = pytest.mark.anyio


async def listed(address: str, query: str = "") -> list[dict]:
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        response = await http.get("/api/sessions" + query)
    assert response.status_code == 200, response.text
    return response.json()


async def test_an_opened_page_stores_no_empty_session(tmp_path):
    data = {"runtime": {"system_prompt": "Be brief."}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("switch_model", route="demo/demo-open")
            await c.until("context")
            assert await listed(address) == []
            await c.say("echo first words")
            sessions = await listed(address)
        assert [s["id"] for s in sessions] == [c.session_id]
        assert sessions[0]["route"] == "demo/demo-open" and sessions[0]["message_count"] == 3
        async with client(address) as d:  # the stored session reopens with its system prompt
            history = [f for f in await d.hello(c.session_id) if f["type"] == "history"][0]
    assert [m["role"] for m in history["messages"]] == ["system", "user", "assistant"]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path) -> Backend:
    """The search runs on both backends; PostgreSQL on a fresh database of the private cluster."""
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path / "data")
    return Backend("postgresql", tmp_path / "unused", request.getfixturevalue("pg_cluster").new_database())


async def seeded(tmp_path, rows, backend: Backend | None = None):
    store = backend.open() if backend else open_store(tmp_path / "data")
    for session_id, title, text in rows:
        await store.create_session(session_id, title=title, route="demo")
        await store.append_messages(session_id, [ChatMessage("user", text)])
    return store


async def test_search_finds_sessions_by_title_and_by_text(tmp_path, backend):
    store = await seeded(tmp_path, [("a", "Garden plans", "tomatoes and basil"),
                                    ("b", "Trip", "the train to Lyon leaves at nine"),
                                    ("c", "100% sure", "nothing here")], backend)
    assert [s.id for s in await store.list_sessions("garden")] == ["a"]
    assert [s.id for s in await store.list_sessions("lyon train")] == ["b"]
    assert [s.id for s in await store.list_sessions("tomat")] == ["a"]  # a prefix matches
    assert [s.id for s in await store.list_sessions("100%")] == ["c"]  # LIKE wildcards are literal
    assert await store.list_sessions("quantum") == []
    await store.save_messages("b", [ChatMessage("user", "now by bus\x00", id="x")])  # a NUL too
    await store.delete_session("a")
    assert await store.list_sessions("tomatoes") == []
    assert [s.id for s in await store.list_sessions("bus")] == ["b"]
    assert [s.id for s in await store.list_sessions("", limit=2)] == ["b", "c"]
    await store.close()


async def test_paging_keeps_sessions_updated_in_the_same_microsecond(tmp_path, backend):
    """Two instances (or workers) each stamp with their own clock, so two sessions can share an
    ``updated_at``; a page that ends on one of them must not skip the other."""
    store = await seeded(tmp_path, [(name, name, "text") for name in ("a", "b", "c", "d")], backend)
    backend.execute("UPDATE sessions SET updated_at = '2000-01-01T10:00:00.000000+00:00' "
                    "WHERE id IN ('b', 'c')")
    first = await store.list_sessions("", limit=3)
    last = first[-1]
    rest = await store.list_sessions("", last.updated_at, 10, last.id)
    time_only = await store.list_sessions("", last.updated_at, 10)
    await store.close()
    assert [s.id for s in first] == ["d", "a", "b"]  # newest first, then by id
    assert [s.id for s in rest] == ["c"]
    assert time_only == []  # what paging by the time alone did: "c" was skipped


async def test_learned_windows_are_kept(backend):
    store = backend.open()
    await store.save_window("demo", "demo-open", 16384)
    await store.save_window("demo", "demo-open", 16000)
    await store.save_window("p", "m/with/slash", 8192)
    await store.close()
    store = backend.open()
    assert await store.load_windows() == {("demo", "demo-open"): 16000, ("p", "m/with/slash"): 8192}
    await store.close()


async def test_session_list_pages_newest_first(tmp_path):
    store = await seeded(tmp_path, [(f"s{n}", f"chat {n}", f"text {n}") for n in range(5)])
    await store.close()
    with serve(settings_for(tmp_path)) as address:
        first = await listed(address, "?limit=2")
        second = await listed(address, f"?limit=2&before={first[-1]['updated_at']}")
        rest = await listed(address, f"?before={second[-1]['updated_at']}")
        found = await listed(address, "?q=text%203")
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            bad = await http.get("/api/sessions?limit=0")
            huge = await http.get("/api/sessions", params={"q": "x" * 5000, "limit": "y" * 5000})
    assert [s["id"] for s in first + second + rest] == ["s4", "s3", "s2", "s1", "s0"]
    assert [s["id"] for s in found] == ["s3"]
    assert bad.status_code == 400 and "limit" in bad.json()["error"]["message"]
    assert huge.status_code == 400 and len(huge.json()["error"]["message"]) < 300


async def test_search_index_is_built_for_a_file_written_before_it(tmp_path):
    store = await seeded(tmp_path, [("old", "Old chat", "a forgotten lighthouse")])
    await store.close()
    # drop the index: a file an older meterchat wrote does not have it
    path = tmp_path / "data" / "meterchat.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.executescript("DROP TRIGGER message_text_insert; DROP TRIGGER message_text_update;"
                                 "DROP TRIGGER message_text_delete; DROP TABLE message_text;"
                                 "DELETE FROM schema_migrations WHERE version = 4;"
                                 "UPDATE schema_version SET version = 3;")
    store = open_store(tmp_path / "data")
    assert [s.id for s in await store.list_sessions("lighthouse")] == ["old"]
    await store.close()
