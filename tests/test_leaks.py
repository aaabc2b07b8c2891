"""No secret leaves the server, end to end: a provider key echoed in an error body, the key the
server sends, and ``user:pass@`` in a ``base_url`` never reach a frame, ``/events``, the page, the
exports, the API or the server's log (at debug level)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from tests.fakes import Reply
from tests.support import client, run_server

pytestmark = pytest.mark.anyio

KEY = "sk-live-9QvTz3LmW8xKpR2dYh6N"  # the key the server holds, and the provider echoes
PASSWORD = "pw-Zq81-hunter"  # in both base_urls
SECRETS = (KEY, KEY[8:], PASSWORD)


def config(tmp_path: Path, fake_url: str) -> Path:
    host = fake_url.split("://", 1)[1]
    path = tmp_path / "meterchat.toml"
    path.write_text(f"""
default_route = "p"
[server]
data_dir = "{tmp_path / "data"}"
[providers.p]
kind = "openai"
base_url = "http://admin:{PASSWORD}@{host}"
api_key_env = "LEAK_TEST_KEY"
model = "m1"
discover_window = false
[providers.down]
kind = "openai"
base_url = "http://admin:{PASSWORD}@127.0.0.1:9/v1"
api_key_env = "LEAK_TEST_KEY"
model = "m2"
discover_window = false
""")
    return path


async def read_events(url: str, lines: list[str], connected: anyio.Event, errors: anyio.Event) -> None:
    async with httpx.AsyncClient() as http, http.stream("GET", f"{url}/events") as response:
        async for line in response.aiter_lines():
            lines.append(line)
            connected.set()
            if sum(line == "event: error" for line in lines) == 2:
                errors.set()
                return


async def test_leaks_no_secret_in_frames_events_page_exports_api_or_log(tmp_path, fake_openai, monkeypatch):
    monkeypatch.setenv("LEAK_TEST_KEY", KEY)
    fake_openai.enqueue(Reply(status=500, error=f"bad request from {KEY} via admin:{PASSWORD}@10.1.2.3 "
                                                + "trace " * 300))
    args = ["-m", "server", "--config", str(config(tmp_path, fake_openai.base_url)), "--host", "127.0.0.1",
            "--port", "0", "--log-level", "debug"]
    with run_server(args) as running:
        lines: list[str] = []
        connected, errors = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tasks, client(running.address) as c:
            tasks.start_soon(read_events, running.url, lines, connected, errors)
            with anyio.fail_after(10):
                await connected.wait()
            await c.hello()
            first = (await c.say("hi"))[-1]
            await c.send("switch_model", route="down")
            second = (await c.say("and again"))[-1]
            with anyio.fail_after(10):
                await errors.wait()
        async with httpx.AsyncClient(base_url=running.url) as http:
            pages = [await http.get(path) for path in (
                "/", f"/s/{c.session_id}", "/healthz", "/api/sessions", f"/api/sessions/{c.session_id}",
                f"/api/sessions/{c.session_id}/export?format=json",
                f"/api/sessions/{c.session_id}/export?format=md")]
        log = "".join(running.output)
    assert first["code"] == "unavailable" and second["code"] == "unavailable"
    assert [page.status_code for page in pages] == [200] * len(pages)
    assert len(fake_openai.requests) == 1  # the provider was reached (and answered with the planted body)
    places = {"frames": json.dumps(c.frames, ensure_ascii=False), "events": "\n".join(lines),
              "pages, api and exports": "\n".join(page.text for page in pages), "log": log}
    assert "bad request from" in places["frames"] and "bad request from" in places["events"]
    for where, text in places.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} leaked into {where}"
