"""Accounts mode against a real server: two users, each trying every route with the other's session
ids, a sign-in cookie and its HttpOnly/SameSite flags, the rate limit on failed sign-ins, the front
door's JSON and Origin rules on sign-in, revocation closing an open socket with 4401, API tokens, and
/events carrying a user's own sessions (an admin's, everyone's)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.accounts_support import PASSWORD, add_users, cookie_header, http_as, run_in_store, sign_in
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                     "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
                                     )).decode()
DOC = {"format": "meterchat.session", "version": 1, "title": "imported by bob", "route": "demo",
       "messages": [{"id": "m1", "role": "user", "content": "bob's own words"}]}


def accounts_settings(tmp_path: Path, **auth: Any):
    return settings_for(tmp_path, {"auth": {"mode": "accounts", "revocation_check_ms": 100, **auth}})


async def alices_session(address: str, cookie: str) -> tuple[str, str]:
    """Alice chats once with an image: her session id and the image's URL."""
    async with client(address, additional_headers=cookie_header(cookie)) as c:
        await c.hello()
        await c.send("message", id="pic", content="echo lighthouse", images=[{"media_type": "image/png",
                                                                              "data": PNG}])
        frames = await c.until("done")
    assert c.session_id is not None
    return c.session_id, of_type(frames, "accepted")[0]["image_urls"][0]


def same_as_missing(answer: httpx.Response, missing: httpx.Response, real_id: str, fake_id: str) -> None:
    """Another user's session answers exactly as one that does not exist (the id quoted aside)."""
    assert answer.status_code == missing.status_code == 404
    assert answer.text.replace(real_id, fake_id) == missing.text


async def test_accounts_page_sends_a_stranger_to_sign_in_and_sets_a_strict_cookie(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            page = await http.get("/")
            signin_page = await http.get("/signin")
            api = await http.get("/api/sessions")
            answer = await http.post("/api/auth/signin", json={"name": "alice", "password": PASSWORD})
            me = await http.get("/api/auth/me")
            home = await http.get("/")
    assert page.status_code == 303 and page.headers["location"] == "/signin"
    assert signin_page.status_code == 200 and 'data-testid="signin-form"' in signin_page.text
    assert api.status_code == 401 and api.json()["error"]["code"] == "unauthorized"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
    assert "secure" not in cookie  # plain HTTP here; behind TLS the flag is set
    assert me.json()["user"]["name"] == "alice" and "password_hash" not in me.json()["user"]
    assert home.status_code == 200 and 'data-testid="account-name">alice<' in home.text


async def test_accounts_wrong_passwords_are_401_then_429_with_the_wait(tmp_path):
    settings = accounts_settings(tmp_path, signin_attempts=3)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            wrong = [await http.post("/api/auth/signin", json={"name": "alice", "password": "nope nope"})
                     for _ in range(3)]
            unknown = await http.post("/api/auth/signin", json={"name": "mallory", "password": "nope nope"})
            limited = await http.post("/api/auth/signin", json={"name": "alice", "password": PASSWORD})
            form = await http.post("/api/auth/signin", data={"name": "alice", "password": PASSWORD})
            foreign = await http.post("/api/auth/signin", json={"name": "alice", "password": PASSWORD},
                                      headers={"Origin": "http://evil.example"})
    assert [w.status_code for w in wrong] == [401, 401, 401]
    assert unknown.status_code == 401 and unknown.json() == wrong[0].json()  # no hint which was wrong
    assert limited.status_code == 429 and "try again in" in limited.json()["error"]["message"]
    assert form.status_code == 415 and foreign.status_code == 403


async def test_accounts_each_user_sees_only_their_own_sessions_on_every_route(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        sid, image = await alices_session(address, alice)
        fake = "f" * len(sid)
        fake_image = image.replace(sid, fake)
        async with http_as(address, bob) as http:
            assert (await http.get("/api/sessions")).json() == []
            assert (await http.get("/api/sessions", params={"q": "lighthouse"})).json() == []
            for method, path, body in (("GET", "/api/sessions/{}", None),
                                       ("PATCH", "/api/sessions/{}", {"title": "mine now"}),
                                       ("GET", "/api/sessions/{}/export?format=json", None),
                                       ("GET", "/api/sessions/{}/export?format=md", None),
                                       ("DELETE", "/api/sessions/{}", None)):
                same_as_missing(await http.request(method, path.format(sid), json=body),
                                await http.request(method, path.format(fake), json=body), sid, fake)
            same_as_missing(await http.get(image), await http.get(fake_image), sid, fake)
            imported = (await http.post("/api/sessions/import", json=DOC)).json()["session_id"]
            bobs = [s["id"] for s in (await http.get("/api/sessions")).json()]
        async with http_as(address, alice) as http:
            alices = [s["id"] for s in (await http.get("/api/sessions")).json()]
            mine = await http.get(f"/api/sessions/{sid}")
            theirs = await http.get(f"/api/sessions/{imported}")
            picture = await http.get(image)
    assert bobs == [imported] and alices == [sid]
    assert mine.json()["title"] == "echo lighthouse" and theirs.status_code == 404
    assert picture.status_code == 200


async def test_accounts_socket_hello_and_resume_with_anothers_id_open_a_new_session(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        sid, _ = await alices_session(address, alice)
        async with client(address, additional_headers=cookie_header(bob)) as c:
            first = await c.hello(sid)
            got_id = c.session_id
        async with client(address, additional_headers=cookie_header(bob)) as c:
            await c.send("hello", session_id=sid, last_seq=3)
            resumed = await c.until("session")
        async with client(address, additional_headers=cookie_header(alice)) as c:
            own = await c.hello(sid)
        with pytest.raises(ConnectionClosed) as closed:
            async with client(address) as c:  # no cookie at all
                await c.send("hello")
                await c.recv()
    assert got_id != sid and first[0]["resumed"] is False
    history = of_type(first, "history")[0]
    assert not [m for m in history["messages"] if m["role"] != "system"]  # nothing of alice's
    assert resumed[-1]["session_id"] not in (sid, got_id) and resumed[-1]["resumed"] is False
    assert own[0]["session_id"] == sid and own[0]["resumed"] is True
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_accounts_events_carry_own_sessions_and_all_for_an_admin(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "admin", "alice", "bob")
    with serve(settings) as address:
        cookies = {name: await sign_in(address, name) for name in ("admin", "alice", "bob")}
        seen: dict[str, list[str]] = {name: [] for name in cookies}
        async with anyio.create_task_group() as tasks:
            for name, cookie in cookies.items():
                await tasks.start(follow_events, address, cookie, seen[name])
            alice_sid, _ = await alices_session(address, cookies["alice"])
            bob_sid, _ = await alices_session(address, cookies["bob"])
            with anyio.fail_after(10):  # the admin hears both; then the others have had their chance
                while not {alice_sid, bob_sid} <= set(seen["admin"]):
                    await anyio.sleep(0.05)
            tasks.cancel_scope.cancel()
    assert set(seen["alice"]) == {alice_sid} and set(seen["bob"]) == {bob_sid}


async def follow_events(address: str, cookie: str, seen: list[str], *, task_status: Any) -> None:
    async with http_as(address, cookie) as http, http.stream("GET", "/events") as events:
        lines = events.aiter_lines()
        assert (await anext(lines)).startswith(":")
        task_status.started()
        async for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["session_id"])


@pytest.mark.parametrize("revoke", ["sign_out", "disable", "password"])
async def test_accounts_revocation_closes_an_open_socket_with_4401_within_a_second(tmp_path, revoke):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        cookie = await sign_in(address, "alice")
        async with client(address, additional_headers=cookie_header(cookie)) as c:
            await c.hello()
            started = time.monotonic()
            if revoke == "sign_out":
                async with http_as(address, cookie) as http:
                    assert (await http.post("/api/auth/signout", json={})).status_code == 204
            elif revoke == "disable":  # as `meterchat users disable` does, from outside the server
                await run_in_store(settings.server.data_dir, lambda d: d.set_disabled("alice"))
            else:
                await run_in_store(settings.server.data_dir,
                                   lambda d: d.set_password("alice", "new password"))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv(timeout=5)
            waited = time.monotonic() - started
        async with http_as(address, cookie) as http:
            after = await http.get("/api/sessions")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    assert waited < 1.0, waited
    assert after.status_code == 401


async def test_accounts_api_tokens_serve_scripts_and_are_shown_once(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice", "bob")
    with serve(settings) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        sid, _ = await alices_session(address, alice)
        async with http_as(address, alice) as http:
            made = (await http.post("/api/auth/tokens", json={"name": "backup script"})).json()
            listed = (await http.get("/api/auth/tokens")).json()
        bearer = {"Authorization": f"Bearer {made['token']}"}
        async with httpx.AsyncClient(base_url=f"http://{address}", headers=bearer) as script:
            sessions = (await script.get("/api/sessions")).json()
            async with script.stream("GET", "/events") as events:
                assert events.status_code == 200
        async with http_as(address, bob) as http:
            stolen = await http.delete(f"/api/auth/tokens/{made['id']}")
        async with http_as(address, alice) as http:
            used = (await http.get("/api/auth/tokens")).json()[0]["last_used"]
            assert (await http.delete(f"/api/auth/tokens/{made['id']}")).status_code == 204
        async with httpx.AsyncClient(base_url=f"http://{address}", headers=bearer) as script:
            revoked = await script.get("/api/sessions")
    assert made["token"].startswith("mc_") and "token" not in listed[0] and listed[0]["last_used"] is None
    assert [s["id"] for s in sessions] == [sid] and used is not None
    assert stolen.status_code == 404 and revoked.status_code == 401


async def test_accounts_admin_lists_users_with_usage_and_a_user_cannot(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "admin", "alice")
    with serve(settings) as address:
        admin, alice = await sign_in(address, "admin"), await sign_in(address, "alice")
        await alices_session(address, alice)
        async with http_as(address, admin) as http:
            rows = {row["name"]: row for row in (await http.get("/api/admin/users")).json()}
            page = await http.get("/admin")
        async with http_as(address, alice) as http:
            refused = await http.get("/api/admin/users")
            no_page, nothing = await http.get("/admin"), await http.get("/no-such-page")
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            stranger = await http.get("/admin")
    assert rows["alice"]["sessions"] == 1 and rows["alice"]["input_tokens"] > 0
    assert rows["admin"]["sessions"] == 0 and rows["admin"]["role"] == "admin"
    assert rows["alice"]["api_tokens"] == 0 and "password_hash" not in rows["alice"]
    assert page.status_code == 200 and 'data-user="alice"' in page.text
    assert refused.status_code == 404
    assert (no_page.status_code, no_page.text) == (nothing.status_code, nothing.text) == (404, "Not Found")
    assert stranger.status_code == 303 and stranger.headers["location"] == "/signin"


async def test_accounts_a_sign_in_flood_is_bounded_and_healthz_answers(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as http:
            statuses: list[int] = []

            async def attempt(n: int) -> None:
                body = {"name": f"user{n}", "password": "x" * 1024}  # the longest password taken
                statuses.append((await http.post("/api/auth/signin", json=body)).status_code)

            async with anyio.create_task_group() as tasks:
                for n in range(40):
                    tasks.start_soon(attempt, n)
                with anyio.fail_after(5):
                    health = await http.get("/healthz")
            huge = await http.post("/api/auth/signin", content=b'{"name": "' + b"a" * 1_000_000 + b'"}',
                                   headers={"Content-Type": "application/json"})
    assert health.status_code == 200
    assert sorted(set(statuses)) == [401, 429] and statuses.count(401) <= 20  # 4 x signin_attempts
    assert huge.status_code == 413


async def test_accounts_sessions_from_before_accounts_go_to_the_first_admin(tmp_path):
    token_days = settings_for(tmp_path, auth_token="shared-token")
    await add_users(token_days.server.data_dir, "alice", "bob")  # accounts made, not yet in force
    with serve(token_days) as address:
        async with client(address, "?token=shared-token") as c:
            await c.hello()
            await c.say("echo from the token days")
    with serve(accounts_settings(tmp_path)) as address:
        alice, bob = await sign_in(address, "alice"), await sign_in(address, "bob")
        async with http_as(address, alice) as http:
            alices = [s["title"] for s in (await http.get("/api/sessions")).json()]
        async with http_as(address, bob) as http:
            bobs = (await http.get("/api/sessions")).json()
    assert alices == ["echo from the token days"] and bobs == []


async def test_accounts_cookie_is_secure_behind_tls(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:  # a proxy on 127.0.0.1 that terminated TLS says so
        async with httpx.AsyncClient(base_url=f"http://{address}",
                                     headers={"X-Forwarded-Proto": "https"}) as http:
            answer = await http.post("/api/auth/signin", json={"name": "alice", "password": PASSWORD})
    assert answer.status_code == 200 and "secure" in answer.headers["set-cookie"].lower()


@pytest.mark.parametrize("revoke", ["sign_out", "token_deleted"])
async def test_accounts_an_events_stream_ends_when_its_sign_in_or_token_is_revoked(tmp_path, revoke):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        cookie = await sign_in(address, "alice")
        async with http_as(address, cookie) as http:
            made = (await http.post("/api/auth/tokens", json={"name": "dashboard"})).json()
        bearer = {"Authorization": f"Bearer {made['token']}"}
        headers = cookie_header(cookie) if revoke == "sign_out" else bearer
        async with httpx.AsyncClient(base_url=f"http://{address}", headers=headers, timeout=10) as http, \
                http.stream("GET", "/events") as events:
            lines = events.aiter_lines()
            assert (await anext(lines)).startswith(":")
            started = time.monotonic()
            async with http_as(address, cookie) as other:
                if revoke == "sign_out":
                    assert (await other.post("/api/auth/signout", json={})).status_code == 204
                else:
                    assert (await other.delete(f"/api/auth/tokens/{made['id']}")).status_code == 204
            with anyio.fail_after(5):
                rest = [line async for line in lines]
            waited = time.monotonic() - started
    assert waited < 1.0 and not [line for line in rest if line.startswith("data:")]


async def test_accounts_api_tokens_per_user_are_bounded(tmp_path):
    settings = accounts_settings(tmp_path)
    await add_users(settings.server.data_dir, "alice")
    with serve(settings) as address:
        async with http_as(address, await sign_in(address, "alice")) as http:
            made = [(await http.post("/api/auth/tokens", json={"name": f"t{n}"})).status_code
                    for n in range(50)]
            over = await http.post("/api/auth/tokens", json={"name": "one more"})
    assert made == [201] * 50 and over.status_code == 400 and "at most 50" in over.json()["error"]["message"]
