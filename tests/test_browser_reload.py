"""A reload shows what the live page showed: after each kind of event the page is read (every row of
the conversation, its state, marks, route, footer, tools, thumbnails, version pager and time), the
page is reloaded and read again, and the two must be equal. Also: a reply still streaming stays
streaming across a reload, an edit of an earlier message previews its drop on the meter, and a wrong
token is closed with 4401 and asked again."""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, FilePayload, Page, expect

from tests.browser_support import (
    ASSISTANT,
    DONE,
    open_new_chat,
    opened_page,
    received,
    running_server,
    send,
    send_and_wait,
    sent,
    write_config,
)
from tests.fakes import Reply
from tests.fakes.openai_fake import FakeOpenAI

pytestmark = pytest.mark.browser



def png(width: int, height: int) -> bytes:
    """A valid grey PNG of this size (a thumbnail whose natural size proves it came back whole)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


# Every row of the conversation as the reader sees it, in order (hidden versions included).
READ_PAGE = """() => [...document.querySelector('[data-testid="conversation"]').children].map((row) => {
  const msg = row.classList.contains("msg-row") ? row.querySelector(":scope > .msg") : row;
  const q = (s) => msg.querySelector(s);
  const time = row.querySelector(":scope > .msg-actions > .msg-time");
  return {
    kind: msg.className, hidden: row.hidden, role: msg.dataset.role || null,
    state: msg.dataset.state || null, turn: msg.dataset.turnId || null,
    excluded: msg.dataset.excluded || null, trimmed: msg.dataset.trimmed || null,
    text: (q(".msg-body") || msg).innerText.trim(),
    route: q(".route")?.textContent || null, routeTitle: q(".route")?.title || null,
    foot: q(".msg-foot")?.textContent || null,
    thinking: q(".thinking") && !q(".thinking").hidden ? q(".thinking-text").textContent : null,
    tools: [...msg.querySelectorAll("details.tool")].map((t) =>
      [t.dataset.toolCallId, t.dataset.state, t.querySelector(".tool-output")?.textContent ?? null]),
    thumbs: [...msg.querySelectorAll(".thumbs img")].map((i) => [i.naturalWidth, i.naturalHeight]),
    version: row.querySelector('[data-testid="version-label"]')?.textContent || null,
    time: time && !time.hidden ? time.getAttribute("datetime") : null,
  };
})"""
IMAGES_LOADED = ("() => [...document.querySelectorAll('.thumbs img')]"
                 ".every((i) => i.complete && i.naturalWidth > 0)")
SHOTS = os.environ.get("METERCHAT_SHOTS")  # a folder: the test leaves its screenshots there to look at


def config(folder: Path, *, delay_ms: int = 5, server: str = "", providers: str = "") -> Path:
    """A short history (trims come early) and priced replies (their cost shows in the footer)."""
    return write_config(folder, delay_ms=delay_ms, extra=server, runtime="max_history_messages = 3",
                        providers="price_input_per_mtok = 3.0\nprice_output_per_mtok = 15.0\n" + providers)


def read_page(page: Page) -> list[dict[str, Any]]:
    page.wait_for_function(IMAGES_LOADED)
    rows: list[dict[str, Any]] = page.evaluate(READ_PAGE)
    return rows


def reload(page: Page) -> None:
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
    page.wait_for_function("() => window.__spy.received.some((f) => f.type === 'history')")


def shoot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def reloads_the_same(page: Page, event: str) -> list[dict[str, Any]]:
    """Every row as before the reload, its time included: the page shows the server's times, live
    (a reply's from its call's route frame) and reloaded."""
    before = read_page(page)
    shoot(page, f"{event}-live")
    reload(page)
    after = read_page(page)
    shoot(page, f"{event}-reloaded")
    assert after == before, (event, [{k: (a[k], b[k]) for k in a if a[k] != b[k]}
                                     for a, b in zip(after, before, strict=False) if a != b])
    return after


def attach_and_send(page: Page, text: str) -> None:
    picture: FilePayload = {"name": "two.png", "mimeType": "image/png", "buffer": png(2, 1)}
    page.get_by_test_id("attach-input").set_input_files(files=[picture])
    expect(page.get_by_test_id("attachments").locator("img")).to_have_count(1)
    send_and_wait(page, text)


def regenerate(page: Page) -> None:
    done = page.locator(DONE).count()
    page.locator(".msg-row.assistant.is-last").get_by_test_id("regenerate").click()
    expect(page.locator(DONE)).to_have_count(done + 1)


def edit_first(page: Page) -> None:
    done = page.locator(DONE).count()
    page.locator('.msg-row.user:not([hidden])').first.get_by_test_id("edit-message").click()
    box = page.get_by_test_id("message-input")
    box.fill("echo the first question, edited")
    box.press("Enter")
    expect(page.locator(DONE)).to_have_count(done + 1)


EVENTS: list[tuple[str, Callable[[Page], None]]] = [
    ("reply", lambda page: send_and_wait(page, "echo the first answer")),
    ("tool-call", lambda page: send_and_wait(page, "please look up paper moon")),
    ("image", lambda page: attach_and_send(page, "echo a picture")),
    ("trim", lambda page: send_and_wait(page, "what do you see of this conversation?")),
    ("regenerate", regenerate),
    ("edit-earlier", edit_first),
]


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_a_reload_after_each_kind_of_event_shows_what_the_live_page_showed(
        browser: Browser, tmp_path: Path, size: tuple[int, int]) -> None:
    with running_server(config(tmp_path)) as base, opened_page(browser, base, viewport=size) as page:
        open_new_chat(page)
        for event, act in EVENTS:
            act(page)
            rows = reloads_the_same(page, f"{event}-{size[0]}")
        kinds = {(r["role"], r["state"]) for r in rows}
        assert ("assistant", "done") in kinds
        assert any(r["kind"].startswith("notice trim") for r in rows)  # the trim notice came back
        assert any(r["tools"] and r["tools"][0][1] == "done" and r["tools"][0][2] for r in rows)
        assert any(r["thumbs"] == [[2, 1]] for r in rows)  # the picture, from the store
        assert any(r["version"] == "2 / 2" for r in rows) and any(r["hidden"] for r in rows)
        assert any(r["excluded"] == "replaced by an edit" for r in rows)
        assert all(r["foot"] and "$" in r["foot"] for r in rows if r["state"] == "done")


def start_a_long_reply(page: Page) -> str:
    """A new chat whose echo of 120 words is streaming; its words."""
    words = " ".join(f"word{i}" for i in range(120))
    open_new_chat(page)
    send(page, f"echo {words}")
    expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("word2 ")
    return words


def test_a_reply_streaming_through_a_reload_stays_streaming_and_a_stopped_one_stays_stopped(
        browser: Browser, tmp_path: Path) -> None:
    with running_server(config(tmp_path, delay_ms=40)) as base, opened_page(browser, base) as page:
        start_a_long_reply(page)
        live_route = page.locator(ASSISTANT).last.locator(".route").text_content()
        reload(page)
        reply = page.locator(ASSISTANT).last
        expect(reply).to_have_attribute("data-state", "streaming")  # not "writing… stopped"
        assert reply.locator(".route").text_content() == live_route  # at once: its call has not ended
        expect(reply.locator(".msg-foot")).not_to_contain_text("stopped")
        expect(page.get_by_test_id("stop")).to_be_enabled()
        expect(reply.locator(".msg-body")).to_contain_text("word20 ")
        page.get_by_test_id("stop").click()
        expect(reply).to_have_attribute("data-state", "stopped")
        before = read_page(page)
        reload(page)
        after = read_page(page)
    assert after == before and after[-1]["state"] == "stopped" and after[-1]["foot"] == "stopped"
    assert live_route == "demo/demo-small" and after[-1]["route"] == live_route  # stopped in its first call


def test_a_reply_stopped_in_its_first_call_keeps_its_route_through_a_reload(
        browser: Browser, tmp_path: Path) -> None:
    with running_server(config(tmp_path, delay_ms=40)) as base, opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "echo " + " ".join(f"word{i}" for i in range(120)))
        expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("word2 ")
        page.get_by_test_id("stop").click()
        expect(page.locator(ASSISTANT).last).to_have_attribute("data-state", "stopped")
        after = reloads_the_same(page, "stopped-first-call")
    assert after[-1]["route"] == "demo/demo-small" and after[-1]["state"] == "stopped"


def test_a_tool_reply_stopped_in_its_second_call_reloads_with_that_call_s_time(
        browser: Browser, tmp_path: Path) -> None:
    """The reply's time is when its latest call began (the route frame live; the stored stop's
    route after a reload), not the first call's, which the stored messages alone would give."""
    with running_server(config(tmp_path, delay_ms=40)) as base, opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "please look up paper moon")
        expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("Paper", timeout=20_000)
        page.get_by_test_id("stop").click()
        expect(page.locator(ASSISTANT).last).to_have_attribute("data-state", "stopped")
        routes = received(page, "route")
        after = reloads_the_same(page, "stopped-second-call")
    assert len(routes) == 2 and after[-1]["tools"][0][1] == "done" and after[-1]["state"] == "stopped"
    assert after[-1]["time"] == str(routes[-1]["created_at"]).replace("+00:00", "")[:23] + "Z"


def test_a_message_typed_while_a_reply_streams_outlives_a_reload_until_it_is_sent(
        browser: Browser, tmp_path: Path) -> None:
    with running_server(config(tmp_path, delay_ms=40)) as base, opened_page(browser, base) as page:
        words = start_a_long_reply(page)
        box = page.get_by_test_id("message-input")
        box.fill("echo typed while it streamed\nsecond line")  # Send waits for the reply
        reload(page)
        expect(box).to_have_value("echo typed while it streamed\nsecond line")
        # An edit of the last message sets the draft aside, and a cancelled edit brings it back.
        page.get_by_test_id("stop").click()
        expect(page.get_by_test_id("send")).to_be_enabled()
        page.locator(".msg-row.user").last.get_by_test_id("edit-message").click()
        expect(box).to_have_value(f"echo {words}")
        page.get_by_test_id("edit-cancel").click()
        expect(box).to_have_value("echo typed while it streamed\nsecond line")
        box.press("Enter")
        expect(page.locator(DONE).last.locator(".msg-body")).to_contain_text("typed while it streamed")
        expect(box).to_have_value("")
        reload(page)
        expect(page.locator(DONE).last.locator(".msg-body")).to_contain_text("typed while it streamed")
        expect(box).to_have_value("")  # sent: no draft comes back
        open_new_chat(page)
        expect(box).to_have_value("")  # a draft belongs to its session


def test_edit_of_an_earlier_message_previews_the_drop_on_the_meter(browser: Browser, tmp_path: Path) -> None:
    with running_server(config(tmp_path)) as base, opened_page(browser, base) as page:
        open_new_chat(page)
        for word in ("one", "two"):
            send_and_wait(page, f"echo {word} " + "filler " * 60)
        used = page.get_by_test_id("meter-used")
        full = used.inner_text()
        first = page.locator(".msg-row.user").first
        first.get_by_test_id("edit-message").click()
        expect(page.get_by_test_id("edit-note")).to_contain_text("an earlier message")
        expect(page.get_by_test_id("edit-note")).to_contain_text("the turn after it")
        page.wait_for_function("() => window.__spy.received.some((f) => f.reason === 'edit_preview')")
        preview = received(page, "context")[-1]
        tokens = preview["estimated_tokens"]
        assert preview["reason"] == "edit_preview" and isinstance(tokens, int)
        expect(used).to_have_text(re.compile(rf"^~?{tokens:,}$"))
        assert tokens < int(full.replace(",", "").lstrip("~"))
        shoot(page, "edit-preview")
        page.get_by_test_id("edit-cancel").click()
        expect(used).to_have_text(full)  # cancelled: the meter reads the whole history again
        first.get_by_test_id("edit-message").click()
        page.get_by_test_id("message-input").fill("echo one, edited")
        page.get_by_test_id("message-input").press("Enter")
        expect(page.locator(DONE).last.locator(".msg-body")).to_have_text("one, edited")
        turn = first.locator(".msg").get_attribute("data-turn-id")
        assert sent(page, "message")[-1].get("edit_of") == turn
        expect(page.locator('[data-role="user"][data-excluded="replaced by an edit"]')).to_have_count(2)


def test_a_wrong_token_is_closed_with_4401_and_asked_again(browser: Browser, tmp_path: Path) -> None:
    path = config(tmp_path, server='auth_token = "sesame-right"')
    with running_server(path) as base, opened_page(browser, base) as page:
        page.add_init_script("""window.__closes = [];
            const Native = window.WebSocket;
            window.WebSocket = class extends Native {
              constructor(...a) {
                super(...a);
                this.addEventListener("close", (e) => window.__closes.push(e.code));
              }
            };""")
        page.goto("/?token=sesame-wrong")
        expect(page.get_by_test_id("token-form")).to_be_visible()
        expect(page.get_by_test_id("token-error")).to_have_text("That token was not accepted. Try again.")
        assert page.evaluate("() => window.__closes") == [4401]  # accepted, then closed: the page can tell


def test_another_tab_shows_the_versions_and_the_set_aside_turns(browser: Browser, tmp_path: Path) -> None:
    with running_server(config(tmp_path)) as base, opened_page(browser, base) as page, \
            opened_page(browser, base) as other:
        open_new_chat(page)
        send_and_wait(page, "echo alpha")
        send_and_wait(page, "echo beta")
        other.goto(page.url)
        expect(other.locator(DONE)).to_have_count(2)
        regenerate(page)
        expect(other.locator(DONE)).to_have_count(3)
        expect(other.get_by_test_id("version-label")).to_have_text(["1 / 2", "2 / 2"])  # the first hidden
        beta_turn = page.locator('[data-role="user"]').nth(1).get_attribute("data-turn-id")
        old = other.locator(f'[data-role="assistant"][data-turn-id="{beta_turn}"]')
        expect(old).to_have_attribute("data-excluded", "replaced by a regenerated reply")
        expect(old).to_be_hidden()
        edit_first(page)
        expect(other.locator('[data-role="user"][data-excluded="replaced by an edit"]')).to_have_count(2)
        assert read_page(other) == read_page(page)


def line_shown(page: Page, selector: str, count: int) -> None:
    expect(page.locator(selector)).to_have_count(count)


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_a_reload_shows_the_errors_and_notices_the_live_page_showed(
        browser: Browser, tmp_path: Path, fake_openai: FakeOpenAI, size: tuple[int, int]) -> None:
    """A switch's confirmation, an unknown hint's listing, a reply that failed half-way and a call
    refused outright (each error with its "Try again") come back where they were, and the stored
    "Try again" sends the failed turn again in its place."""
    provider = (f'[providers.p]\nkind = "openai"\nbase_url = "{fake_openai.base_url}"\n'
                'model = "m"\ntools = false')
    with running_server(config(tmp_path, providers=provider)) as base, \
            opened_page(browser, base, viewport=size) as page:
        open_new_chat(page)
        send_and_wait(page, "echo on the demo")
        send(page, "/model p/m")
        line_shown(page, '[data-testid="notice"][data-code="switched"]', 1)
        reloads_the_same(page, f"switch-{size[0]}")
        send_and_wait(page, "/hint nowhere tell me")
        line_shown(page, '[data-testid="notice"][data-code="unknown_hint"]', 1)
        reloads_the_same(page, f"hint-{size[0]}")
        fake_openai.enqueue(Reply(text=["half ", "a reply"], stream_error="the model is overloaded",
                                  error_type="overloaded_error"))
        send(page, "tell me more")
        line_shown(page, '[data-testid="error"]', 1)
        rows = reloads_the_same(page, f"failed-reply-{size[0]}")
        assert [r["state"] for r in rows if r["role"] == "assistant"][-1] == "error"
        fake_openai.enqueue(Reply(status=503, error="try again later"))
        send(page, "and again")
        line_shown(page, '[data-testid="error"]', 2)
        rows = reloads_the_same(page, f"failed-call-{size[0]}")
        errors = [r["text"] for r in rows if r["kind"] == "notice error"]
        assert len(errors) == 2 and all(e.endswith("Try again") for e in errors)
        done = page.locator(DONE).count()
        page.get_by_test_id("try-again").last.click()
        expect(page.locator(DONE)).to_have_count(done + 1)
        assert sent(page, "message")[-1]["content"] == "and again" and sent(page, "message")[-1]["retry_of"]
        reloads_the_same(page, f"retried-{size[0]}")


def test_a_line_on_an_older_page_comes_back_with_its_page(
        browser: Browser, tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    """History comes in pages: a failed turn's error that follows a message on an older page waits
    for that page, then takes its place, as the live page showed it."""
    provider = (f'[providers.p]\nkind = "openai"\nbase_url = "{fake_openai.base_url}"\n'
                'model = "m"\ntools = false')
    path = config(tmp_path, server="history_page_messages = 4", providers=provider)
    with running_server(path) as base, opened_page(browser, base) as page:
        open_new_chat(page)
        send(page, "/model p/m")
        line_shown(page, '[data-testid="notice"][data-code="switched"]', 1)
        fake_openai.enqueue(Reply(status=503, error="try again later"))
        send(page, "first, refused")
        line_shown(page, '[data-testid="error"]', 1)
        for word in ("two", "three", "four"):
            send_and_wait(page, f"echo {word}")
        live = read_page(page)
        reload(page)
        line_shown(page, '[data-testid="error"]', 0)  # its message is on an older page
        older, rows = page.get_by_test_id("load-older"), page.locator("[data-message-id]")
        while older.count():  # one page per click: the next click waits for this page to land
            shown = rows.count()
            older.click()
            expect(rows).not_to_have_count(shown)
        line_shown(page, '[data-testid="error"]', 1)
        after = read_page(page)
    assert after == live
