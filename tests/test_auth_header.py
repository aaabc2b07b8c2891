"""``[auth] mode = "header"``: the user an authenticating proxy names in ``user_header`` is believed
only from ``trusted_proxies``; from any other address every request is refused, header or not."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.errors import ConfigError
from server.web.access import exposure_problem
from tests.support import client, run_server, serve, settings_for

pytestmark = pytest.mark.anyio


def header_settings(tmp_path: Path, trusted: list[str]):
    return settings_for(tmp_path, {"auth": {"mode": "header", "user_header": "Remote-User",
                                            "trusted_proxies": trusted}})


async def test_header_mode_from_a_trusted_proxy_names_the_user(tmp_path):
    with serve(header_settings(tmp_path, ["127.0.0.0/8"])) as address:
        alice, bob = {"Remote-User": "alice"}, {"Remote-User": "bob"}
        async with client(address, additional_headers=alice) as c:
            await c.hello()
            await c.say("echo hello from alice")
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            mine = (await http.get("/api/sessions", headers=alice)).json()
            theirs = (await http.get("/api/sessions", headers=bob)).json()
            me = (await http.get("/api/auth/me", headers=bob)).json()
            nobody = await http.get("/api/sessions")
        async with client(address, additional_headers=bob) as c:
            first = await c.hello(mine[0]["id"])
        with pytest.raises(ConnectionClosed) as closed:
            async with client(address) as c:
                await c.send("hello")
                await c.recv()
    assert [s["title"] for s in mine] == ["echo hello from alice"] and theirs == []
    assert me["user"]["name"] == "bob" and me["user"]["role"] == "user"  # alice came first: the admin
    assert nobody.status_code == 401 and "Remote-User" in nobody.json()["error"]["message"]
    assert first[0]["session_id"] != mine[0]["id"]
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_header_mode_refuses_every_request_from_an_untrusted_address(tmp_path):
    with serve(header_settings(tmp_path, ["10.9.9.9"])) as address:
        forged = {"Remote-User": "admin"}
        async with httpx.AsyncClient(base_url=f"http://{address}", headers=forged) as http:
            answers = [await http.get(path) for path in ("/", "/api/sessions", "/events", "/api/auth/me")]
            health = await http.get("/healthz")
        with pytest.raises(InvalidStatus) as refused:
            async with client(address, additional_headers=forged):
                pass
    assert [a.status_code for a in answers] == [403, 403, 403, 403]
    assert "authenticating proxy" in answers[1].json()["error"]["message"]
    assert health.status_code == 200
    assert refused.value.response.status_code == 403


async def test_header_mode_judges_the_real_peer_not_a_forwarded_address(tmp_path):
    """uvicorn would take the peer from X-Forwarded-For when a request comes from 127.0.0.1; in
    header mode the server is started without that, so the trusted proxy stays the peer."""
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n[auth]\nmode = "header"\n'
                      'trusted_proxies = ["127.0.0.1"]\n')
    with run_server(config) as running:
        async with httpx.AsyncClient(base_url=running.url) as http:
            through_proxy = await http.get("/api/sessions", headers={"X-Forwarded-User": "alice",
                                                                     "X-Forwarded-For": "203.0.113.9"})
    assert through_proxy.status_code == 200


@pytest.mark.parametrize(("auth", "words"), [
    ({"mode": "header"}, "auth.trusted_proxies: header mode needs"),
    ({"mode": "token"}, "auth.mode: token needs server.auth_token"),
    ({"mode": "ldap"}, "auth.mode: expected one of none, token, accounts, header"),
    ({"mode": "accounts", "session_days": 0}, "auth.session_days: must be greater than 0"),
])
def test_auth_settings_are_checked_naming_the_key(tmp_path, auth, words):
    with pytest.raises(ConfigError, match=words):
        settings_for(tmp_path, {"auth": auth})


def test_auth_exposed_bind_is_fine_with_accounts_or_header():
    assert exposure_problem("0.0.0.0", "", "accounts") is None
    assert exposure_problem("0.0.0.0", "", "header") is None
    assert exposure_problem("0.0.0.0", "", "none") is not None


def test_oidc_admin_claim_and_account_names():
    from server.web.oidc import account_name, is_admin

    assert is_admin({"groups": ["staff", "admins"]}, "groups", ["admins"])
    assert is_admin({"role": "admins"}, "role", ["admins"]) and is_admin({"admin": True}, "admin", [])
    assert not is_admin({"groups": ["staff"]}, "groups", ["admins"]) and not is_admin({}, "groups", ["x"])
    assert account_name({"sub": "s", "preferred_username": "Ann Lee"}) == "Ann-Lee"
    assert account_name({"sub": "s", "email": "ann@example.com"}) == "ann@example.com"
    assert account_name({"sub": "s-1"}) == "s-1"
