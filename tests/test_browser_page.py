"""The page's everyday comforts in a real browser: message actions, highlighting, the meter's
breakdown, the welcome, the sidebar's menu, shortcuts and a wrong access token.

Like tests/test_browser.py: a real server on the demo provider, Debian's chromium, waits on
conditions only. Frames are read from the socket spy in tests/browser_support.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.browser_support import (
    CHROMIUM_ARGS,
    DONE,
    chromium_path,
    feed,
    open_menu,
    open_new_chat,
    opened_page,
    received,
    running_server,
    send,
    send_and_wait,
    sent,
    write_config,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(write_config(tmp_path_factory.mktemp("meterchat"))) as url:
        yield url


@pytest.fixture
def page(browser: Browser, base_url: str) -> Iterator[Page]:
    with opened_page(browser, base_url) as page:
        yield page


def fmt(n: int) -> str:
    return f"{n:,}"


def test_copy_on_a_message_copies_its_markdown_source(browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
        open_new_chat(page)
        send_and_wait(page, "echo **bold** and `code`")
        row = page.locator(".msg-row.assistant").last
        copy = row.get_by_test_id("copy-message")
        actions = row.locator(".msg-actions")
        expect(actions).to_have_css("opacity", "0")  # quiet until the reader points at it
        row.hover()
        expect(actions).to_have_css("opacity", "1")
        copy.click()
        expect(copy).to_have_text("Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == "**bold** and `code`"
        expect(row.get_by_test_id("message-time")).to_have_text(re.compile(r"\d"))
        user_row = page.locator(".msg-row.user").last
        page.mouse.move(0, 0)
        user_row.get_by_test_id("copy-message").focus()  # keyboard focus shows the actions too
        expect(user_row.locator(".msg-actions")).to_have_css("opacity", "1")
        user_row.get_by_test_id("copy-message").press("Enter")
        expect(user_row.get_by_test_id("copy-message")).to_have_text("Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == "echo **bold** and `code`"


def test_code_is_highlighted_and_the_highlighter_loads_only_for_code(page: Page) -> None:
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    open_new_chat(page)
    send_and_wait(page, "echo plain words, no code")
    assert not [url for url in fetched if "/vendor/highlight/" in url]
    send_and_wait(page, "echo ```python\ndef greet(name):\n    return 'hi ' + name\n```")
    code = page.locator(DONE).last.locator("pre code")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-string").first).to_have_text("'hi '")
    expect(code).to_have_text("def greet(name):\n    return 'hi ' + name\n")
    assert any(url.endswith("/vendor/highlight/languages/python.js") for url in fetched)


def test_meter_breakdown_shows_the_numbers_of_the_last_context_frame(page: Page) -> None:
    open_new_chat(page)
    page.wait_for_function("() => window.__spy.received.some((f) => f.type === 'context')")
    frame = received(page, "context")[-1]
    breakdown = page.get_by_test_id("meter-breakdown")
    expect(breakdown).to_be_hidden()
    page.get_by_test_id("meter-toggle").click()
    expect(breakdown).to_be_visible()
    expect(page.get_by_test_id("meter-toggle")).to_have_attribute("aria-expanded", "true")
    row = page.get_by_test_id
    route = f"{frame['provider']}/{frame['model']} ({frame['route_kind']})"
    expect(row("breakdown-route")).to_have_text(route)
    expect(row("breakdown-tokens")).to_contain_text(f"{fmt(frame['estimated_tokens'])} tokens")
    expect(row("breakdown-budget")).to_have_text(f"{fmt(frame['context_token_budget'])} tokens")
    expect(row("breakdown-window")).to_have_text(f"{fmt(frame['model_context_window'])} tokens")
    expect(page.get_by_test_id("breakdown-window-source")).to_have_text("configuration")
    expect(page.get_by_test_id("breakdown-trims")).to_have_text("No trims this session")
    expect(page.get_by_test_id("breakdown-calibration")).to_have_count(0)  # absent from the frame

    # A frame with every field, as a richer server may send: each number lands in its row.
    full = {
        "type": "context", "provider": "p", "model": "m", "route_kind": "hint", "reason": "usage",
        "estimated_tokens": 1234, "tokens_source": "provider", "context_token_budget": 3000,
        "model_context_window": 8192, "window_source": "provider",
        "trim_preview": {"turns": 2, "tokens": 456},
        "calibration_ratio": 1.25, "system_tokens": 120, "reply_reserve": 1024,
    }
    feed(page, full)
    expect(page.get_by_test_id("breakdown-tokens")).to_have_text("1,234 tokens (counted by the provider)")
    expect(page.get_by_test_id("breakdown-window")).to_have_text("8,192 tokens")
    expect(page.get_by_test_id("breakdown-window-source")).to_have_text("provider metadata")
    expect(page.get_by_test_id("breakdown-trim-preview")).to_have_text("2 turns, ~456 tokens")
    expect(page.get_by_test_id("breakdown-calibration")).to_have_text("× 1.25 of the estimate")
    expect(page.get_by_test_id("breakdown-system-tokens")).to_have_text("120 tokens")
    expect(page.get_by_test_id("breakdown-reply-reserve")).to_have_text("1,024 tokens")
    page.keyboard.press("Escape")
    expect(breakdown).to_be_hidden()


def test_breakdown_lists_the_trims_of_this_session(page: Page) -> None:
    open_new_chat(page)
    for title in ["paper moon", "harbour letters", "seventh garden", "spark train", "chess in the rain"]:
        send_and_wait(page, f"please look up {title}")
        if page.get_by_test_id("trim-notice").count():
            break
    trims = received(page, "history_trimmed")
    assert trims
    page.get_by_test_id("meter-toggle").click()
    items = page.get_by_test_id("breakdown-trim")
    expect(items).to_have_count(len(trims))
    first = trims[0]
    expect(items.first).to_contain_text(f"{first['dropped_turns']} turn")
    tokens = f"{fmt(first['tokens_before'])} → {fmt(first['tokens_after'])} tokens"
    expect(items.first).to_contain_text(tokens)
    last = received(page, "context")[-1]
    expect(page.get_by_test_id("breakdown-tokens")).to_contain_text(f"{fmt(last['estimated_tokens'])} tokens")


def test_an_empty_chat_welcomes_with_examples_that_work(page: Page) -> None:
    open_new_chat(page)
    welcome = page.get_by_test_id("welcome")
    expect(welcome).to_be_visible()
    examples = page.get_by_test_id("example")
    expect(examples).to_have_count(4)
    expect(examples.filter(has_text="/model demo/demo-open")).to_have_count(1)
    examples.filter(has_text="/model demo/demo-open").click()
    box = page.get_by_test_id("message-input")
    expect(box).to_have_value("/model demo/demo-open")
    box.press("Enter")
    expect(page.get_by_test_id("meter-window")).to_contain_text("window unknown")
    expect(welcome).to_be_hidden()


def test_sidebar_groups_by_day_counts_messages_and_keeps_actions_in_a_menu(page: Page) -> None:
    first = open_new_chat(page)
    send_and_wait(page, "echo alpha session")
    second = open_new_chat(page)
    send_and_wait(page, "echo beta session")
    expect(page.get_by_test_id("session-group").first.locator("h2")).to_have_text("Today")
    row = page.locator(f'[data-testid="session-item"][data-session-id="{second}"]')
    expect(row.get_by_test_id("session-meta")).to_contain_text(re.compile(r"\b2 messages\b"))
    expect(row.get_by_test_id("session-rename")).to_be_hidden()
    open_menu(page, second)
    menu = row.get_by_test_id("session-menu")
    expect(menu.get_by_role("menuitem")).to_have_text(["Rename", "Export Markdown", "Export JSON", "Delete"])
    expect(menu.get_by_role("menuitem").first).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(menu.get_by_role("menuitem").nth(1)).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(row.get_by_test_id("session-menu-button")).to_be_focused()

    search = page.get_by_test_id("session-search")
    search.fill("alpha")
    expect(page.locator(f'[data-session-id="{first}"]')).to_be_visible()
    expect(page.locator(f'[data-session-id="{second}"]')).to_have_count(0)
    search.fill("")
    expect(page.locator(f'[data-session-id="{second}"]')).to_be_visible()


def test_sessions_fall_into_today_yesterday_and_earlier(page: Page) -> None:
    open_new_chat(page)
    groups = page.evaluate(
        """async () => {
            const { groupByDay } = await import("/static/js/sessions.js");
            const now = new Date(2026, 10, 29, 9, 0);
            const at = (d, h) => new Date(2026, 10, d, h, 0).toISOString();
            const sessions = [
                {id: "a", updated_at: at(29, 8)}, {id: "b", updated_at: at(28, 23)},
                {id: "c", updated_at: at(28, 0)}, {id: "d", updated_at: at(27, 23)},
            ];
            return groupByDay(sessions, now).map(([label, items]) => [label, items.map((s) => s.id)]);
        }"""
    )
    assert groups == [["Today", ["a"]], ["Yesterday", ["b", "c"]], ["Earlier", ["d"]]]


def test_keyboard_shortcuts_and_up_to_edit_the_last_message(page: Page) -> None:
    first = open_new_chat(page)
    send_and_wait(page, "echo first try")
    old_turn = page.locator('[data-role="user"]').last.get_attribute("data-turn-id")
    box = page.get_by_test_id("message-input")
    box.focus()
    box.press("ArrowUp")
    expect(box).to_have_value("echo first try")
    expect(page.get_by_test_id("edit-note")).to_be_visible()
    box.fill("echo second try")
    box.press("Enter")
    expect(page.locator(DONE).last.locator(".msg-body")).to_have_text("second try")
    assert sent(page, "message")[-1].get("retry_of") == old_turn
    old_user = page.locator(f'[data-role="user"][data-turn-id="{old_turn}"]')
    expect(old_user).to_have_attribute("data-excluded", "replaced by an edit")
    expect(page.get_by_test_id("edit-note")).to_be_hidden()

    page.keyboard.press("Control+k")
    expect(page.get_by_test_id("session-search")).to_be_focused()
    page.keyboard.press("Control+Shift+O")
    expect(page).not_to_have_url(re.compile(f"/s/{first}$"))
    expect(page.get_by_test_id("welcome")).to_be_visible()


def test_regenerate_replaces_the_last_reply_and_keeps_the_old_one(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "echo once more")
    row = page.locator(".msg-row.assistant").last
    old_turn = row.locator('[data-role="assistant"]').get_attribute("data-turn-id")
    row.hover()
    row.get_by_test_id("regenerate").click()
    expect(page.locator(DONE)).to_have_count(2)
    again = sent(page, "message")[-1]
    assert (again["content"], again.get("retry_of")) == ("echo once more", old_turn)
    old = page.locator(f'[data-role="assistant"][data-turn-id="{old_turn}"]')
    expect(old).to_have_attribute("data-excluded", "replaced by a regenerated reply")
    expect(old).to_be_hidden()  # one version at a time; the pager flips between them
    new = page.locator(DONE).last
    expect(new.get_by_test_id("version-label")).to_have_text("2 / 2")
    expect(page.locator('[data-role="user"]:visible')).to_have_count(1)
    new.get_by_role("button", name="Previous version").click()
    expect(old).to_be_visible()
    expect(new).to_be_hidden()
    expect(old.get_by_test_id("version-label")).to_have_text("1 / 2")
    expect(old.get_by_role("button", name="Previous version")).to_be_disabled()
    old.get_by_role("button", name="Next version").click()
    expect(new).to_be_visible()
    expect(old).to_be_hidden()


def test_finished_replies_are_announced_politely(page: Page) -> None:
    open_new_chat(page)
    announcer = page.get_by_test_id("announcer")
    expect(announcer).to_have_attribute("aria-live", "polite")
    send_and_wait(page, "echo read me aloud")
    expect(announcer).to_have_text("Reply finished: read me aloud")


def test_scrolled_up_reader_gets_a_button_back_to_the_stream(browser: Browser, tmp_path: Path) -> None:
    words = "\n\n".join(f"paragraph {i}" for i in range(120))
    with running_server(write_config(tmp_path, delay_ms=30)) as base:
        with opened_page(browser, base, viewport=(900, 500)) as page:
            open_new_chat(page)
            send(page, f"echo {words}")
            conversation = page.get_by_test_id("conversation")
            expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("paragraph 30")
            button = page.get_by_test_id("scroll-bottom")
            conversation.evaluate("(el) => el.scrollTo(0, 0)")
            expect(button).to_be_visible()
            button.click()
            at_bottom = "(el) => el.scrollHeight - el.scrollTop - el.clientHeight < 240"
            page.wait_for_function(at_bottom, arg=conversation.element_handle())
            expect(page.locator(DONE)).to_have_count(1, timeout=60_000)
            expect(button).to_be_hidden()


def test_a_wrong_token_asks_again(browser: Browser, tmp_path: Path) -> None:
    config = write_config(tmp_path, extra='auth_token = "sesame-right"')
    with running_server(config) as base:
        with opened_page(browser, base) as page:
            page.goto("/?token=sesame-wrong")
            form = page.get_by_test_id("token-form")
            expect(form).to_be_visible()
            expect(page.get_by_test_id("token-error")).to_have_text("That token was not accepted. Try again.")
            assert page.evaluate("() => localStorage.getItem('meterchat.token')") is None
            page.get_by_test_id("token-input").fill("sesame-right")
            page.get_by_test_id("token-input").press("Enter")
            expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
            expect(form).to_be_hidden()
            # A server that accepts and then closes with 4401 is read the same way.
            close = "() => window.__spy.sockets.at(-1).dispatchEvent(new CloseEvent('close', {code: 4401}))"
            page.evaluate(close)
            expect(form).to_be_visible()
            assert page.evaluate("() => localStorage.getItem('meterchat.token')") is None


def test_an_opened_tool_stays_open_while_the_reply_streams(page: Page) -> None:
    open_new_chat(page)
    feed(page, {"type": "accepted", "id": "m-tool", "turn_id": "t-tool", "content": "look"})
    call = {"turn_id": "t-tool", "id": "c1", "name": "lookup_document"}
    feed(page, {"type": "tool_call", **call, "args": {"title": "x"}})
    feed(page, {"type": "tool_result", **call, "output": "text"})
    tool = page.locator('[data-tool-call-id="c1"]')
    expect(tool).to_have_attribute("data-state", "done")
    tool.locator("summary").click()
    expect(tool.locator(".tool-output")).to_be_visible()
    for i in range(5):
        feed(page, {"type": "chunk", "turn_id": "t-tool", "content": f"w{i} "})
    body = page.locator('[data-turn-id="t-tool"][data-role="assistant"] .msg-body')
    expect(body).to_have_text("w0 w1 w2 w3 w4")
    expect(tool.locator(".tool-output")).to_be_visible()
