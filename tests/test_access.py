"""The front door (server/web/access.py) against a real server: Host allow-list on HTTP and WebSocket,
JSON-only and same-origin state changes under /api, the /ws Origin, the start-up refusal of an
exposed bind without a token, and no token in the access log."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.types import Receive, Scope, Send
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as connect_sync

from server.cli import refuse_exposure
from server.web.access import (
    AccessGuard,
    default_hosts,
    exposure_problem,
    host_matches,
    host_name,
    is_loopback,
)
from tests.support import client, serve, settings_for

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parent.parent
SESSION_DOC = {"format": "meterchat.session", "version": 1, "title": "planted", "route": "demo",
               "messages": []}


async def raw_request(address: str, head: str) -> str:
    """Send a hand-written request head (as ``curl -H`` would) and return the status line."""
    host, port = address.rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
        answer = b""
        while b"\r\n" not in answer:
            answer += await stream.receive()
    return answer.split(b"\r\n", 1)[0].decode()


def upgrade_head(host: str, *extra: str) -> str:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = ["GET /ws HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", *extra]
    return "\n".join(lines)


async def test_access_foreign_host_is_refused_on_http_and_websocket(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        port = address.rsplit(":", 1)[1]
        evil = f"evil.example:{port}"
        api = await raw_request(address, f"GET /api/sessions HTTP/1.1\nHost: {evil}\nConnection: close")
        page = await raw_request(address, f"GET / HTTP/1.1\nHost: {evil}\nConnection: close")
        ws = await raw_request(address, upgrade_head(evil, f"Origin: http://{evil}"))
        ws_ok = await raw_request(address, upgrade_head(address, f"Origin: http://{address}"))
    assert api.startswith("HTTP/1.1 400") and page.startswith("HTTP/1.1 400")
    assert not ws.startswith("HTTP/1.1 101") and ws.split()[1] in ("400", "403")
    assert ws_ok.startswith("HTTP/1.1 101")


async def test_access_loopback_names_with_any_port_are_served(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        port = address.rsplit(":", 1)[1]
        heads = [f"GET /api/sessions HTTP/1.1\nHost: {name}\nConnection: close"
                 for name in (address, f"localhost:{port}", f"[::1]:{port}", "LOCALHOST", "127.0.0.1:1")]
        statuses = [await raw_request(address, head) for head in heads]
        missing = await raw_request(address, "GET /api/sessions HTTP/1.0")
    assert all(status.startswith("HTTP/1.1 200") for status in statuses), statuses
    assert missing.split()[1] == "400"  # no Host at all: nothing to check, so nothing served


async def test_access_allowed_hosts_adds_names_and_wildcards(tmp_path):
    settings = settings_for(tmp_path, allowed_hosts=["chat.lan", "*.example.com"])
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            def status(host: str):
                return http.get("/healthz", headers={"Host": host})

            assert (await status("chat.lan:8000")).status_code == 200
            assert (await status("a.example.com")).status_code == 200
            assert (await status("b.a.example.com:443")).status_code == 200
            refused = await status("example.com")  # the wildcard names subdomains only
            assert (await status("example.com.evil.test")).status_code == 400
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "bad_host"


async def test_access_form_posts_are_refused_json_is_served(tmp_path):
    import json

    body = json.dumps(SESSION_DOC)
    with serve(settings_for(tmp_path)) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            async def post(content_type: str, **headers: str) -> httpx.Response:
                return await http.post("/api/sessions/import", content=body,
                                       headers={"Content-Type": content_type, **headers})

            plain = await post("text/plain")
            form = await post("application/x-www-form-urlencoded")
            multipart = await post("multipart/form-data; boundary=x")
            none = await http.post("/api/sessions/import", content=body)
            ok = await post("application/json; charset=utf-8")
            listed = (await http.get("/api/sessions")).json()
    assert [r.status_code for r in (plain, form, multipart, none)] == [415] * 4
    assert plain.json()["error"]["code"] == "unsupported_media_type"
    assert ok.status_code == 201
    assert [s["id"] for s in listed] == [ok.json()["session_id"]]  # nothing planted by the forms


async def test_access_deeply_nested_body_is_a_bad_request(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            deep = await http.post("/api/sessions/import", content="[" * 100_000 + "]" * 100_000,
                                   headers={"Content-Type": "application/json"})
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]


async def test_access_state_changes_need_a_same_origin(tmp_path):
    with serve(settings_for(tmp_path, allowed_origins=["https://chat.example.com"])) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            async def post(**headers: str) -> int:
                response = await http.post("/api/sessions/import", json=SESSION_DOC, headers=headers)
                return response.status_code

            assert await post(Origin="http://evil.example") == 403
            assert await post(Origin="null") == 403
            assert await post(Origin=f"http://localhost:{address.rsplit(':', 1)[1]}") == 403  # another origin
            assert await post(**{"Sec-Fetch-Site": "cross-site"}) == 403
            assert await post(Origin=f"http://{address}", **{"Sec-Fetch-Site": "same-origin"}) == 201
            assert await post(Origin="https://chat.example.com", **{"Sec-Fetch-Site": "cross-site"}) == 201
            assert await post() == 201  # not a browser: no Origin to check
            sessions = (await http.get("/api/sessions", headers={"Origin": "http://evil.example"})).json()
            target = f"/api/sessions/{sessions[0]['id']}"
            rename = await http.patch(target, json={"title": "x"}, headers={"Origin": "http://evil.example"})
            plain_delete = await http.request("DELETE", target, content="{}",
                                              headers={"Content-Type": "text/plain"})
            deleted = await http.delete(target)  # no body: no form can send it, CORS guards scripts
    assert rename.status_code == 403 and plain_delete.status_code == 415
    assert deleted.status_code == 204


async def test_access_socket_origin_is_checked_against_allowed_hosts(tmp_path):
    settings = settings_for(tmp_path, allowed_origins=["https://chat.example.com"])
    with serve(settings) as address:
        port = address.rsplit(":", 1)[1]
        for origin in (f"http://localhost:{port}", "http://evil.example", "null"):
            with pytest.raises(InvalidStatus):
                async with client(address, origin=origin):
                    pass
        with pytest.raises(InvalidStatus):
            async with client(address, origin=f"http://{address}",
                              additional_headers={"Sec-Fetch-Site": "cross-site"}):
                pass
        async with client(address, origin="https://chat.example.com") as c:
            assert (await c.hello())[0]["type"] == "session"
        async with client(address, origin=f"http://{address}") as c:
            assert (await c.hello())[0]["type"] == "session"


def test_access_host_names_and_patterns():
    assert host_name("[::1]:8000") == "::1" and host_name("LocalHost:1") == "localhost"
    assert host_name("example.com") == "example.com"
    hosts = default_hosts("0.0.0.0", ["*.Example.com", "[fd00::1]"])
    assert "0.0.0.0" not in hosts and "fd00::1" in hosts
    assert host_matches("a.example.com", hosts) and not host_matches("example.com", hosts)
    assert host_matches("192.0.2.7", default_hosts("192.0.2.7", []))


def test_access_connection_address_is_allowed_on_a_wildcard_bind():
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("only the guard's decision is asked for")

    guard = AccessGuard(app, bind_host="0.0.0.0", allowed_hosts=[], allowed_origins=[])

    def refusal(host: str, local: str):
        scope = {"type": "http", "method": "GET", "path": "/", "server": (local, 8000),
                 "headers": [(b"host", host.encode())]}
        return guard.refusal(scope)

    assert refusal("192.0.2.7:8000", "192.0.2.7") is None  # a LAN browser pointed at this machine
    assert refusal("[fd00::7]:8000", "fd00::7") is None
    assert refusal("rebound.example:8000", "192.0.2.7") is not None
    assert refusal("192.0.2.8:8000", "192.0.2.7") is not None


def test_access_exposed_bind_needs_a_token():
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"):
        assert is_loopback(host) and exposure_problem(host, "") is None
    assert exposure_problem("0.0.0.0", "t0ken") is None
    for host in ("0.0.0.0", "::", "192.0.2.7", "myhost.lan"):
        problem = exposure_problem(host, "")
        assert problem is not None and "METERCHAT_SERVER_AUTH_TOKEN" in problem and "\n" not in problem


def test_access_insecure_no_auth_overrides_loudly(capsys):
    refuse_exposure("0.0.0.0", "", insecure=True)
    assert "WARNING" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        refuse_exposure("0.0.0.0", "", insecure=False)


def test_access_exposed_bind_without_token_refuses_to_start(tmp_path):
    env = {**os.environ, "METERCHAT_DATA_DIR": str(tmp_path / "data")}
    env.pop("METERCHAT_SERVER_AUTH_TOKEN", None)
    result = subprocess.run([sys.executable, "-m", "server", "--host", "0.0.0.0", "--port", "0"],
                            capture_output=True, text=True, timeout=30, cwd=REPO, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "auth token" in lines[0] and "METERCHAT_SERVER_AUTH_TOKEN" in lines[0]
    assert "--insecure-no-auth" in lines[0]


def test_access_token_never_reaches_the_log(tmp_path):
    secret = "s3cret-in-the-url"
    env = {**os.environ, "METERCHAT_DATA_DIR": str(tmp_path / "data"),
           "METERCHAT_SERVER_AUTH_TOKEN": secret}
    server = subprocess.Popen([sys.executable, "-m", "server", "--port", "0", "--log-level", "info"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        address = started_address(server)
        with httpx.Client(base_url=f"http://{address}") as http:
            assert http.get(f"/?token={secret}").status_code == 200
            assert http.get(f"/api/sessions?x=1&token={secret}").status_code == 200
            assert http.get("/api/sessions?token=wrong").status_code == 401
        with connect_sync(f"ws://{address}/ws?token={secret}") as ws:
            ws.send('{"type": "hello"}')
            assert '"session"' in ws.recv(timeout=10)
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    log = out + err
    assert secret not in log
    assert log.count("token=[redacted]") >= 3  # the lines are there, only the value is gone


def started_address(server: subprocess.Popen[str]) -> str:
    """Read uvicorn's start-up lines until it names the port it bound (the server chose it)."""
    assert server.stderr is not None
    for line in server.stderr:
        if "Uvicorn running on http://" in line:
            return line.split("http://", 1)[1].split()[0]
    raise AssertionError("the server exited before it started")
