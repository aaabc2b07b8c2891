"""The app around the socket: the page, health, auth, the observer stream, start-up errors."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


async def test_page_and_health_are_served(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            page = await http.get("/")
            session_page = await http.get("/s/abc123")
            health = (await http.get("/healthz")).json()
            script = await http.get("/static/js/app.js")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert session_page.status_code == 200
    assert health == {"ok": True, "providers": ["demo"], "default_route": "demo"}
    assert script.status_code == 200


async def test_auth_guards_socket_events_and_api(tmp_path):
    with serve(settings_for(tmp_path, auth_token="s3cret")) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            refused = [await http.get("/api/sessions"), await http.get("/events")]
            assert [r.status_code for r in refused] == [401, 401]
            assert refused[0].json() == refused[1].json() == {
                "error": {"code": "unauthorized", "message": "bearer token required"}}
            ok = await http.get("/api/sessions", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200
            assert (await http.get("/")).status_code == 200
        with pytest.raises((ConnectionClosed, InvalidStatus)):
            async with client(address) as c:
                await c.hello()
        async with client(address, "?token=s3cret") as c:
            frames = await c.hello()
    assert frames[0]["type"] == "session"


async def test_socket_refuses_a_foreign_origin(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        with pytest.raises((ConnectionClosed, InvalidStatus)):
            async with client(address, origin="http://evil.example") as c:
                await c.hello()
        async with client(address, origin=f"http://{address}") as c:
            assert (await c.hello())[0]["type"] == "session"


async def test_events_stream_carries_history_trimmed(tmp_path):
    settings = settings_for(tmp_path, {"runtime": {"max_history_messages": 1}})
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as http:
            async with http.stream("GET", "/events") as events:
                lines = events.aiter_lines()
                assert (await anext(lines)).startswith(":")
                async with client(address) as c:
                    await c.hello()
                    await c.say("one")
                    frames = await c.say("two")
                assert of_type(frames, "history_trimmed")
                seen = []
                async for line in lines:
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["type"] == "history_trimmed":
                            break
    trimmed = seen[-1]
    assert trimmed["session_id"] == c.session_id and trimmed["source"] == "observability"
    assert trimmed["reason"] == "turn_limit" and trimmed["dropped_turns"] == 1


def test_bad_config_stops_startup_naming_the_key(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[runtime]\nmax_context_tokenz = 5\n')
    result = subprocess.run([sys.executable, "-m", "server", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "runtime.max_context_tokenz: unknown setting" in result.stderr


async def test_socket_token_as_a_subprotocol_keeps_it_out_of_the_url(tmp_path):
    token = "s3cret/with+odd=chars"
    encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    with serve(settings_for(tmp_path, auth_token=token)) as address:
        async with client(address, subprotocols=["meterchat.v1", f"bearer.{encoded}"]) as c:
            assert c.ws.subprotocol == "meterchat.v1"
            assert (await c.hello())[0]["type"] == "session"
        with pytest.raises((ConnectionClosed, InvalidStatus)):
            async with client(address, subprotocols=["meterchat.v1", "bearer.d3Jvbmc"]) as c:
                await c.hello()


def test_route_to_a_model_the_provider_lacks_stops_startup(tmp_path):
    config = tmp_path / "bad-route.toml"
    config.write_text('[[model_routes]]\nhint = "fast"\nprovider = "demo"\nmodel = "demo-huge"\n')
    result = subprocess.run([sys.executable, "-m", "server", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "model_routes[0]: unknown model 'demo-huge'" in result.stderr
