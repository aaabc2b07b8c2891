from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from server.history.messages import ChatMessage
from server.store.backends import open_store
from server.store.base import CallRecord, message_to_data
from server.store.sqlite import SqliteStore
from server.web.api import EXCEPTION_HANDLERS, ApiState, api_routes
from server.web.export import to_json
from tests.test_store import every_field_messages


@dataclass
class Harness:
    client: TestClient
    store: SqliteStore
    changes: list[tuple[str, str]] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)  # changes whose on_change raises

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return anyio.run(partial(fn, *args, **kwargs))

    def seed(self, session_id: str, title: str = "A chat") -> list[ChatMessage]:
        messages = every_field_messages()
        self.run(self.store.create_session, session_id, title=title, route="demo")
        self.run(self.store.append_messages, session_id, messages)
        self.run(self.store.record_call, session_id,
                 CallRecord("t1", "demo", "demo-small", "default", 10, 2, "provider", 0.01))
        return messages


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Harness]:
    store = open_store(tmp_path)
    changes: list[tuple[str, str]] = []
    broken: set[str] = set()

    async def on_change(session_id: str, what: str) -> None:
        changes.append((session_id, what))
        if what in broken:
            raise RuntimeError(f"live sessions could not follow {what}")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[ApiState]:
        yield {"store": store, "on_change": on_change}

    app = Starlette(routes=api_routes(max_import_bytes=200_000), lifespan=lifespan,
                    exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(app) as client:
        yield Harness(client, store, changes, broken)
    anyio.run(store.close)


def error_of(response: Any) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return response.status_code, body["error"]["code"], body["error"]["message"]


def test_api_lists_sessions_newest_first(api: Harness) -> None:
    assert api.client.get("/api/sessions").json() == []
    api.seed("old", "Old")
    api.seed("new", "New")
    listed = api.client.get("/api/sessions").json()
    assert [(s["id"], s["title"], s["message_count"]) for s in listed] == \
        [("new", "New", 7), ("old", "Old", 7)]
    assert set(listed[0]) == {"id", "title", "route", "created_at", "updated_at", "message_count"}


def test_api_pages_after_the_last_row_by_time_and_id(api: Harness) -> None:
    for name in ("a", "b", "c"):
        api.seed(name, name.upper())
    first = api.client.get("/api/sessions?limit=2").json()
    last = first[-1]
    rest = api.client.get("/api/sessions", params={"before": last["updated_at"], "before_id": last["id"]})
    assert [s["id"] for s in first] == ["c", "b"] and [s["id"] for s in rest.json()] == ["a"]
    too_long = api.client.get("/api/sessions", params={"before": "x", "before_id": "i" * 201})
    assert error_of(too_long) == (400, "bad_request", "before_id: at most 200 characters, got 201")


def test_api_get_one_summary(api: Harness) -> None:
    api.seed("s")
    assert api.client.get("/api/sessions/s").json()["message_count"] == 7
    assert error_of(api.client.get("/api/sessions/nope"))[:2] == (404, "unknown_session")


def test_api_rename_returns_the_summary_and_tells_live_sessions(api: Harness) -> None:
    api.seed("s")
    response = api.client.patch("/api/sessions/s", json={"title": "  Renamed ✓ "})
    assert response.status_code == 200
    assert response.json()["title"] == "Renamed ✓"
    assert api.run(api.store.get_summary, "s").title == "Renamed ✓"
    assert api.changes == [("s", "renamed")]


def test_api_change_hook_failure_is_logged_and_the_answer_stands(
        api: Harness, caplog: pytest.LogCaptureFixture) -> None:
    api.seed("s")
    api.broken.add("deleted")
    assert api.client.delete("/api/sessions/s").status_code == 204
    assert api.run(api.store.get_summary, "s") is None and api.changes == [("s", "deleted")]
    assert "on_change('s', 'deleted') failed" in caplog.text


@pytest.mark.parametrize("body, field_named", [
    ({}, "title: required"), ({"title": 3}, "title: expected a string"),
    ({"title": "   "}, "title: expected 1 to 200"), ({"title": "x" * 201}, "title: expected 1 to 200"),
    (["title"], "title: required"),
])
def test_api_rename_rejects_bad_titles(api: Harness, body: Any, field_named: str) -> None:
    api.seed("s")
    status, code, message = error_of(api.client.patch("/api/sessions/s", json=body))
    assert (status, code) == (400, "bad_request") and message.startswith(field_named)
    assert api.changes == []


def test_api_rename_unknown_session_is_404(api: Harness) -> None:
    assert error_of(api.client.patch("/api/sessions/ghost", json={"title": "t"}))[:2] == \
        (404, "unknown_session")


def test_api_rename_rejects_invalid_json(api: Harness) -> None:
    api.seed("s")
    response = api.client.patch("/api/sessions/s", content=b"{nope",
                                headers={"content-type": "application/json"})
    assert error_of(response)[:2] == (400, "bad_request")
    assert "not valid JSON" in error_of(response)[2]


def test_api_delete_removes_and_then_404s(api: Harness) -> None:
    api.seed("s")
    response = api.client.delete("/api/sessions/s")
    assert response.status_code == 204 and response.content == b""
    assert api.run(api.store.get_session, "s") is None
    assert api.changes == [("s", "deleted")]
    assert error_of(api.client.delete("/api/sessions/s"))[:2] == (404, "unknown_session")


def test_api_export_json_is_an_attachment_of_the_whole_session(api: Harness) -> None:
    messages = api.seed("s0123456789", "Hello, World ✓")
    response = api.client.get("/api/sessions/s0123456789/export?format=json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-disposition"] == \
        'attachment; filename="meterchat-hello-world-s0123456.json"'
    document = response.json()
    assert document["format"] == "meterchat.session"
    assert document["messages"] == [message_to_data(m) for m in messages]
    assert document["calls"][0]["cost_usd"] == 0.01


def test_api_export_markdown(api: Harness) -> None:
    api.seed("s")
    response = api.client.get("/api/sessions/s/export", params={"format": "md"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert response.headers["content-disposition"].endswith('.md"')
    assert response.text.startswith("# A chat\n") and "_(trimmed, no longer sent)_" in response.text


def test_api_export_rejects_unknown_format_and_session(api: Harness) -> None:
    api.seed("s")
    assert error_of(api.client.get("/api/sessions/s/export?format=pdf"))[:2] == (400, "bad_request")
    assert error_of(api.client.get("/api/sessions/x/export?format=md"))[:2] == (404, "unknown_session")


def test_api_import_round_trips_an_export_under_a_new_id(api: Harness) -> None:
    messages = api.seed("s")
    exported = api.client.get("/api/sessions/s/export?format=json").json()
    response = api.client.post("/api/sessions/import", json=exported)
    assert response.status_code == 201
    new_id = response.json()["session_id"]
    assert new_id != "s"
    imported = api.run(api.store.get_session, new_id)
    assert [message_to_data(m) for m in imported.messages] == [message_to_data(m) for m in messages]
    assert api.changes == [(new_id, "imported")]
    assert len(api.client.get("/api/sessions").json()) == 2


def test_api_import_rejects_a_bad_document_naming_the_field(api: Harness) -> None:
    document = to_json(api.run(lambda: _stored(api)))
    document["messages"][1]["role"] = "robot"
    status, code, message = error_of(api.client.post("/api/sessions/import", json=document))
    assert (status, code) == (400, "import_rejected") and message.startswith("messages[1].role:")
    assert len(api.client.get("/api/sessions").json()) == 1


async def _stored(api: Harness) -> Any:
    await api.store.create_session("src", title="t", route="demo")
    await api.store.append_messages("src", every_field_messages())
    return await api.store.get_session("src")


def test_api_import_over_the_limit_is_413(api: Harness) -> None:
    big = json.dumps({"format": "meterchat.session", "padding": "x" * 300_000})
    status, code, message = error_of(api.client.post("/api/sessions/import", content=big))
    assert (status, code) == (413, "too_large")
    assert message == f"body: {len(big):,} bytes is over the limit of 200,000 bytes (server.max_import_bytes)"

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while streaming
        for _ in range(30):
            yield b"x" * 10_000

    assert error_of(api.client.post("/api/sessions/import", content=chunks())) == (
        413, "too_large", "body: over the limit of 200,000 bytes (server.max_import_bytes)")
    assert api.client.get("/api/sessions").json() == []



def test_api_errors_quote_client_values_cut_short(api: Harness) -> None:
    huge = "x" * 20_000
    api.seed("abc")
    doc = {"format": "meterchat.session", "version": 1, "title": "t", "route": "demo",
           "messages": [{"id": "a", "role": "user", "content": "hi"}]}
    message = doc["messages"][0]
    answers = [
        api.client.get(f"/api/sessions/{huge}"),
        api.client.patch(f"/api/sessions/{huge}", json={"title": "t"}),
        api.client.get(f"/api/sessions/{huge}/export"),
        api.client.get("/api/sessions/abc/export", params={"format": huge}),
        api.client.post("/api/sessions/import", json={**doc, "format": huge}),
        api.client.post("/api/sessions/import", json={**doc, "messages": [{**message, huge: 1}]}),
        api.client.post("/api/sessions/import", json={**doc, "messages": [{**message, "role": huge}]}),
        api.client.post("/api/sessions/import", json={**doc, "messages": [doc["messages"][0]] * 2}),
    ]
    for answer in answers:
        status, _, message = error_of(answer)
        assert 400 <= status < 500 and len(message) < 400, message[:300]
