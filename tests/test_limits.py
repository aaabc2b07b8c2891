"""Bounds at the edge of a real server: the frame rate, the connection cap, hello and idle
deadlines, the resolver's caches."""

from __future__ import annotations

import json
import socket
import time

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.config.load import settings_from_mapping
from server.errors import ConfigError
from server.history.messages import ChatMessage
from server.routing.resolver import RouteResolver
from server.store.sqlite import SqliteStore
from server.web.app import create_app
from server.web.limits import TokenBucket
from server.web.serving import guarded_h11, guarded_httptools
from tests.support import SHORT_REPLY, client, run_server, serve, settings_for, slow_settings

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_spends_its_burst_then_refills_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.1)
    clock.now = 0.1
    assert bucket.take() == 0.0
    clock.now = 100.0
    assert [bucket.take() for _ in range(4)][-1] > 0  # refilled to the burst, never above it


async def test_limits_frame_flood_is_answered_once_with_rate_limited_and_the_session_goes_on(tmp_path):
    with serve(settings_for(tmp_path, frame_rate=50, frame_burst=5)) as address:
        async with client(address) as c:
            await c.hello()
            for _ in range(200):
                await c.send("stop")
            error = await c.recv()
            assert error["type"] == "error" and error["code"] == "rate_limited"
            assert error["retryable"] is True and error["retry_after"] > 0
            # Refused frames are dropped unanswered; a resend of one message id is idempotent, so
            # the client resends until the bucket has a token again.
            accepted = None
            while accepted is None:
                await c.send("message", id="after-flood", content="echo still here")
                try:
                    frame = await c.recv(timeout=0.2)
                except TimeoutError:
                    continue
                accepted = frame if frame["type"] == "accepted" else None
            frames = await c.until("done", "error")
    assert frames[-1]["type"] == "done"
    errors = [f for f in c.frames if f["type"] == "error"]
    # A run of refused frames is answered once (frames let through as the bucket refills start a
    # new run): far fewer answers than the ~190 frames refused.
    assert {f["code"] for f in errors} == {"rate_limited"} and len(errors) < 20


async def test_limits_connection_over_max_connections_is_closed_with_1013(tmp_path):
    with serve(settings_for(tmp_path, max_connections=2)) as address:
        async with client(address) as first, client(address) as second:
            await first.hello()
            await second.hello()
            async with client(address) as third:
                with pytest.raises(ConnectionClosed) as closed:
                    await third.hello()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert "max_connections" in closed.value.rcvd.reason
        assert await hello_once_a_slot_is_free(address)  # the slots are given back when sockets close


async def hello_once_a_slot_is_free(address: str, attempts: int = 50) -> bool:
    """The server frees a slot when its handler for the closed socket ends, just after the client
    saw the close: a new client may be turned away with 1013 until then (each try is answered)."""
    for _ in range(attempts):
        async with client(address) as again:
            try:
                return bool((await again.hello())[0]["type"] == "session")
            except ConnectionClosed as closed:
                if closed.rcvd is None or closed.rcvd.code != 1013:
                    raise
    return False


async def test_limits_connection_without_hello_is_closed(tmp_path):
    with serve(settings_for(tmp_path, hello_timeout_seconds=0.3)) as address:
        async with client(address) as c:
            with pytest.raises(ConnectionClosed) as closed:
                await c.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_limits_idle_connection_is_closed_with_1001_but_not_while_a_reply_streams(tmp_path):
    with serve(slow_settings(tmp_path, idle_timeout_seconds=0.5)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="q1", content=SHORT_REPLY)  # streams for about a second
            frames = await c.until("done", timeout=10)
            assert frames[-1]["type"] == "done"
            with pytest.raises(ConnectionClosed) as closed:
                await c.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


async def test_limits_route_caches_stay_bounded_however_many_models_a_client_names():
    from tests.test_routing import CountingProvider, make_settings

    settings = make_settings(server={"route_cache_entries": 16})
    resolver = RouteResolver(settings, {"local": CountingProvider({"m7": 1000})})
    for n in range(500):
        route = resolver.parse(f"local/m{n}")  # an unlisted model is accepted while discovery is on
        await resolver.capacity(route)
        resolver.calibration.observe(route, 100, 120)
    assert len(resolver._windows) == 16 and not len(resolver._discovering)
    assert len(resolver.calibration) == 16
    assert (await resolver.capacity(resolver.parse("local/m499"))).source is None  # still cached


def trickle_until_closed(address: str, pace: float, budget: float) -> float | None:
    """Open a raw socket, send a request line, then one header byte every ``pace`` seconds (the
    wait for the server's answer is the pacing); the seconds until the server closed, or None."""
    host, port = address.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=pace) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: " + address.encode() + b"\r\n")
        while time.monotonic() - started < budget:
            try:
                if raw.recv(1024) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                pass
            try:
                raw.sendall(b"X")
            except OSError:  # closed under the write
                return time.monotonic() - started
    return None


def head_refused(url: str, size: int) -> bool:
    """A request whose head is ``size`` bytes is answered 400/431 or cut off while being sent."""
    try:
        return httpx.get(f"{url}/healthz", headers={"x-big": "a" * size}).status_code in (400, 431)
    except httpx.TransportError:
        return True


def test_limits_slowloris_header_is_cut_off_by_header_timeout(tmp_path):
    """Through ``python -m server``: the cli serves with the guarded parser."""
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\nheader_timeout_seconds = 1.0\n')
    with run_server(config) as running:
        closed_after = trickle_until_closed(running.address, pace=0.2, budget=8.0)
        assert httpx.get(f"{running.url}/healthz").status_code == 200  # a prompt client is served
    assert closed_after is not None and 0.8 < closed_after < 4.0


@pytest.mark.parametrize("guarded", [lambda: guarded_h11(1.0), lambda: guarded_httptools(1.0, 65536)],
                         ids=["h11", "httptools"])
def test_limits_each_http_parser_bounds_request_heads(tmp_path, guarded):
    with run_server(create_app(settings_for(tmp_path)), http=guarded(), h11_max_incomplete_event_size=65536,
                    timeout_keep_alive=30) as running:
        closed_after = trickle_until_closed(running.address, pace=0.2, budget=8.0)
        refused = head_refused(running.url, 1_000_000)
        with httpx.Client() as http:  # a kept-alive connection's next head has the same deadline
            assert http.get(f"{running.url}/healthz").status_code == 200
            assert http.get(f"{running.url}/healthz").status_code == 200
    assert closed_after is not None and 0.8 < closed_after < 4.0
    assert refused  # a head over max_header_bytes is refused


async def stored_session(data_dir, messages: list[ChatMessage]) -> None:
    store = SqliteStore.open(data_dir)
    await store.create_session("big", title="imported", route="demo/demo-small")
    await store.append_messages("big", messages)
    await store.close()


async def test_limits_history_comes_in_pages_newest_first_and_the_client_pages_back(tmp_path):
    roles = ["user", "assistant"]
    messages = [ChatMessage(roles[n % 2], f"message {n}", id=f"m{n}") for n in range(450)]
    messages[100] = ChatMessage("assistant", "z" * 3_000_000, id="m100")  # one message over a page
    await stored_session(tmp_path / "data", messages)
    with serve(settings_for(tmp_path, history_page_messages=200)) as address:
        async with client(address) as c:
            await c.send("hello", session_id="big")
            first = (await c.until("history"))[-1]
            pages = [first]
            while pages[-1].get("older"):
                await c.send("history_before", before_id=pages[-1]["messages"][0]["id"], limit=500)
                pages.append((await c.until("history_page"))[-1])
            raw = [len(json.dumps(page)) for page in pages]
    assert [m["id"] for m in first["messages"]] == [f"m{n}" for n in range(250, 450)]
    assert first["older"] == 250
    assert all(page["type"] == "history_page" for page in pages[1:])
    ids = [m["id"] for page in reversed(pages) for m in page["messages"]]
    assert ids == [m.id for m in messages]  # every message once, in order, newest page first
    assert max(raw) < 1.5 * 1024 * 1024  # the 3 MB message was clipped to a page
    clipped = next(m for page in pages for m in page["messages"] if m["id"] == "m100")
    assert "more characters, in the session export" in clipped["content"]


@pytest.mark.browser
def test_limits_page_loads_older_history_pages_on_demand(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from tests.browser_support import CHROMIUM_ARGS, chromium_path, opened_page, running_server, write_config

    config = write_config(tmp_path, extra="history_page_messages = 10")
    roles = ["user", "assistant"]
    anyio.run(stored_session, tmp_path / "data",
              [ChatMessage(roles[n % 2], f"message {n}", id=f"m{n}") for n in range(25)])
    with running_server(config) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        with opened_page(browser, url) as page:
            page.goto("/s/big")
            shown = page.get_by_test_id("conversation").locator("[data-message-id]")
            expect(shown).to_have_count(10)
            older = page.get_by_test_id("load-older")
            expect(older).to_have_text("Load older messages (15)")
            older.click()
            expect(shown).to_have_count(20)
            older.click()
            expect(shown).to_have_count(25)
            expect(older).to_have_count(0)
            assert shown.first.get_attribute("data-message-id") == "m0"
            assert shown.last.get_attribute("data-message-id") == "m24"
        browser.close()


@pytest.mark.parametrize("key", ["max_connections", "frame_rate", "frame_burst", "history_page_messages",
                                 "header_timeout_seconds", "route_cache_entries"])
def test_limits_a_zero_bound_stops_start_up_naming_the_key(key):
    with pytest.raises(ConfigError, match=f"server.{key}: must be greater than 0"):
        settings_from_mapping({"server": {key: 0}}, env={})
