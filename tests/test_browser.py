"""The page in a real browser against a real server on the embedded demo provider.

Each test opens a fresh browser context (its own storage) on a server started as a subprocess;
waits are for conditions on the page, never for fixed times. Any uncaught error in the page's
JavaScript fails the test that caused it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.browser_support import (
    ASSISTANT,
    CHROMIUM_ARGS,
    DONE,
    chromium_path,
    feed,
    open_menu,
    open_new_chat,
    opened_page,
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


def test_page_streams_a_demo_reply_and_renders_it(page: Page) -> None:
    open_new_chat(page)
    send(page, "hello, who are you?")
    expect(page.locator('[data-role="user"]').last).to_have_text("hello, who are you?")
    reply = page.locator(ASSISTANT).last
    expect(reply).to_have_attribute("data-state", "done")
    # The demo's self-description is markdown: bold model name and a fenced code block.
    expect(reply.locator(".msg-body strong").first).to_have_text("demo-small")
    expect(reply.locator("pre code")).to_contain_text("budget = min(")
    expect(reply.get_by_test_id("reply-route")).to_have_text("demo/demo-small")
    expect(page.get_by_test_id("message-input")).to_have_value("")
    expect(page.get_by_test_id("stop")).to_be_disabled()


def test_echo_renders_markdown_and_model_html_never_runs(page: Page) -> None:
    open_new_chat(page)
    hostile = (
        "echo ## Heading\n\n```js\nconsole.log('fenced');\n```\n\n"
        '<img src="x-missing.png" onerror="window.__pwned = 1">\n\n'
        "<script>window.__pwned = 2</script>\n\n"
        '[link](javascript:window.__pwned=3)'
    )
    send_and_wait(page, hostile)
    reply = page.locator(DONE).last
    expect(reply.locator("h2")).to_have_text("Heading")
    expect(reply.locator("pre code")).to_have_text("console.log('fenced');")
    expect(reply.get_by_test_id("copy-code")).to_have_count(1)
    expect(reply.locator("script")).to_have_count(0)
    expect(reply.locator("[onerror]")).to_have_count(0)
    # Let the image finish failing to load, so an onerror handler would have had its chance to run.
    page.evaluate(
        """() => new Promise((resolve) => {
            const img = document.querySelector('[data-role="assistant"][data-state="done"] img');
            if (!img || img.complete) return resolve();
            img.addEventListener("error", resolve);
            img.addEventListener("load", resolve);
        })"""
    )
    link = reply.locator("a", has_text="link")
    if link.count():
        assert not (link.get_attribute("href") or "").lower().startswith("javascript:")
        link.click()
    assert page.evaluate("() => window.__pwned") is None


def test_copy_button_copies_the_code(browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
        open_new_chat(page)
        send_and_wait(page, "echo ```\nmake test\n```")
        page.locator(DONE).last.get_by_test_id("copy-code").click()
        expect(page.locator(DONE).last.get_by_test_id("copy-code")).to_have_text("Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == "make test"


def test_meter_follows_the_route_and_says_when_the_window_is_unknown(page: Page) -> None:
    open_new_chat(page)
    meter = page.get_by_test_id("meter")
    expect(page.get_by_test_id("meter-route")).to_have_text("demo/demo-small")
    expect(page.get_by_test_id("meter-window")).to_have_text("4,096")
    expect(page.get_by_test_id("meter-used")).to_have_text(re.compile(r"^~?\d[\d,]*$"))
    # ratio 0.6 of a 4,096 window: the trimming budget sits inside the bar.
    expect(page.get_by_test_id("meter-budget-marker")).to_be_visible()
    window_line = re.compile(r"Context window: 4,096 tokens \(from configuration\)")
    expect(meter).to_have_attribute("title", window_line)
    send_and_wait(page, "echo a few words to count")
    used_small = page.get_by_test_id("meter-used").inner_text()

    page.get_by_test_id("model-picker").select_option("demo/demo-open")
    expect(page.get_by_test_id("meter-route")).to_have_text("demo/demo-open")
    window = page.get_by_test_id("meter-window")
    expect(window).to_contain_text("window unknown")
    expect(window).not_to_contain_text("4,096")
    expect(meter).to_have_attribute("data-window-known", "false")
    expect(meter).to_have_attribute("title", re.compile("Context window: unknown"))
    expect(page.get_by_test_id("meter-budget-marker")).to_be_hidden()
    assert page.get_by_test_id("meter-used").inner_text()

    send_and_wait(page, "echo now on the open model")
    expect(page.locator(DONE).last.get_by_test_id("reply-route")).to_have_text("demo/demo-open")
    expect(page.get_by_test_id("meter-used")).not_to_have_text(used_small)


def test_meter_levels_and_a_missing_window_clears_the_old_one(page: Page) -> None:
    open_new_chat(page)
    expect(page.get_by_test_id("meter-window")).to_have_text("4,096")
    meter = page.get_by_test_id("meter")
    base = {
        "type": "context", "provider": "p", "model": "m", "route_kind": "hint", "tokens_source": "provider",
        "context_token_budget": 1000, "reason": "usage",
    }
    known = {"model_context_window": 2000, "window_source": "provider"}
    feed(page, {**base, "estimated_tokens": 100, **known})
    expect(meter).to_have_attribute("data-level", "calm")
    expect(page.get_by_test_id("meter-used")).to_have_text("100")  # provider counts carry no "~"
    expect(page.get_by_test_id("meter-route")).to_have_text("p/m")
    expect(page.get_by_test_id("meter-route-kind")).to_have_text("hint")
    expect(meter).to_have_attribute("title", re.compile(r"from provider metadata"))
    preview = page.get_by_test_id("trim-preview")
    expect(preview).to_be_hidden()
    feed(page, {**base, "estimated_tokens": 1500, "model_context_window": 2000,
                           "trim_preview": {"turns": 2, "tokens": 1234}})
    expect(meter).to_have_attribute("data-level", "warn")
    expect(preview).to_be_visible()
    expect(preview).to_have_text("Next send will trim 2 turns, ~1,234 tokens, to fit the budget.")
    expect(page.get_by_test_id("meter-budget-marker")).to_be_visible()
    feed(page, {**base, "estimated_tokens": 1900, "model_context_window": 2000})
    expect(meter).to_have_attribute("data-level", "danger")
    expect(preview).to_be_hidden()  # a frame without a preview clears the old one
    feed(page, {**base, "estimated_tokens": 500})  # no window: the budget is the scale
    expect(page.get_by_test_id("meter-window")).to_have_text("1,000 budget (window unknown)")
    expect(page.get_by_test_id("meter-percent")).to_have_text("50%")
    feed(page, {**base, "estimated_tokens": 500, "context_token_budget": 0})
    expect(page.get_by_test_id("meter-window")).to_have_text("window unknown")
    expect(meter).to_have_attribute("data-level", "unknown")
    expect(page.get_by_test_id("meter-percent")).to_have_text("")


def test_trims_show_a_notice_and_grey_the_dropped_turns(page: Page) -> None:
    session_id = open_new_chat(page)
    titles = ["paper moon", "harbour letters", "seventh garden", "spark train", "chess in the rain"]
    for title in titles:
        send_and_wait(page, f"please look up {title}")
        if page.get_by_test_id("trim-notice").count():
            break
    notice = page.get_by_test_id("trim-notice").first
    expect(notice).to_contain_text(re.compile(r"\d+ turns? \(\d+ messages?\) dropped, \d+ kept"))
    first_user = page.locator('[data-role="user"]').first
    expect(first_user).to_have_attribute("data-trimmed", "true")
    expect(page.locator('[data-role="user"]').last).not_to_have_attribute("data-trimmed", "true")

    # A reload restores the transcript from the history frame, greyed turns included.
    page.reload()
    expect(page).to_have_url(re.compile(f"/s/{session_id}$"))
    expect(page.locator('[data-role="user"]').first).to_have_attribute("data-trimmed", "true")
    expect(page.locator('[data-role="user"]').last).not_to_have_attribute("data-trimmed", "true")
    expect(page.get_by_test_id("meter-route")).to_have_text("demo/demo-small")


def test_reload_during_a_slow_stream_ends_with_the_whole_reply(browser: Browser, tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(40))
    with running_server(write_config(tmp_path, delay_ms=60)) as base:
        with opened_page(browser, base) as page:
            open_new_chat(page)
            send(page, f"echo {words}")
            streaming = page.locator('[data-role="assistant"][data-state="streaming"] .msg-body')
            expect(streaming).to_contain_text("word3 ")
            expect(page.get_by_test_id("stop")).to_be_enabled()
            page.reload()
            expect(page.locator(DONE)).to_have_count(1)
            expect(page.locator(DONE).locator(".msg-body")).to_have_text(words)
            expect(page.locator('[data-role="user"]')).to_have_count(1)


@pytest.mark.parametrize("how", ["button", "escape key"])
def test_stop_keeps_the_partial_reply_and_marks_it(browser: Browser, tmp_path: Path, how: str) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    with running_server(write_config(tmp_path, delay_ms=40)) as base:
        with opened_page(browser, base) as page:
            open_new_chat(page)
            send(page, f"echo {words}")
            expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("w2 ")
            if how == "button":
                page.get_by_test_id("stop").click()
            else:
                page.get_by_test_id("message-input").press("Escape")
            reply = page.locator(ASSISTANT).last
            expect(reply).to_have_attribute("data-state", "stopped")
            expect(reply.locator(".msg-foot")).to_contain_text("stopped")
            assert "w0" in reply.locator(".msg-body").inner_text()
            expect(page.get_by_test_id("send")).to_be_enabled()


def test_session_list_shows_the_session_and_rename_works(page: Page) -> None:
    session_id = open_new_chat(page)
    send_and_wait(page, "echo naming this session")
    item = page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')
    expect(item).to_be_visible()
    expect(item).to_have_attribute("aria-current", "")
    open_menu(page, session_id).get_by_test_id("session-rename").click()
    field = item.get_by_test_id("session-rename-input")
    field.fill("Renamed by the browser test")
    field.press("Enter")
    expect(item.get_by_test_id("session-title")).to_have_text("Renamed by the browser test")
    page.reload()
    item = page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')
    expect(item.get_by_test_id("session-title")).to_have_text("Renamed by the browser test")
    export = open_menu(page, session_id).locator("a", has_text="JSON")
    expect(export).to_have_attribute("href", re.compile(f"{session_id}/export\\?format=json"))


def test_narrow_screen_hides_the_sidebar_behind_a_toggle(page: Page) -> None:
    page.set_viewport_size({"width": 390, "height": 800})
    open_new_chat(page)
    sidebar = page.get_by_test_id("sidebar")
    expect(sidebar).not_to_be_in_viewport()
    page.get_by_test_id("sidebar-toggle").click()
    expect(sidebar).to_be_in_viewport()
    page.get_by_test_id("message-input").click(position={"x": 300, "y": 10})
    expect(sidebar).not_to_be_in_viewport()
    expect(page.get_by_test_id("message-input")).to_be_visible()


PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360f8cfc0f01f0005000201a5fb2b8f0000000049454e44ae426082"
)


def test_attached_image_is_sent_and_shown(page: Page) -> None:
    open_new_chat(page)
    page.get_by_test_id("attach-input").set_input_files(
        files=[{"name": "dot.png", "mimeType": "image/png", "buffer": PNG_1X1}]
    )
    expect(page.get_by_test_id("attachments").locator("img")).to_have_count(1)
    send_and_wait(page, "echo got the picture")
    user = page.locator('[data-role="user"]').last
    expect(user).to_have_attribute("data-state", "sent")
    expect(user.locator(".thumbs img")).to_have_count(1)
    expect(page.get_by_test_id("attachments")).to_be_hidden()
    page.reload()  # from the history frame the picture comes by URL, from the store
    stored = page.locator('[data-role="user"]').last.locator(".thumbs img")
    expect(stored).to_have_count(1)
    expect(stored).to_have_js_property("naturalWidth", 1)


def test_token_form_when_the_server_needs_auth(browser: Browser, tmp_path: Path) -> None:
    config = write_config(tmp_path, extra='auth_token = "sesame-browser-test"')
    with running_server(config) as base:
        with opened_page(browser, base) as page:
            page.goto("/")
            form = page.get_by_test_id("token-form")
            expect(form).to_be_visible()
            expect(page.get_by_test_id("connection-status")).not_to_have_attribute("data-status", "online")
            page.get_by_test_id("token-input").fill("sesame-browser-test")
            page.get_by_test_id("token-input").press("Enter")
            expect(form).to_be_hidden()
            expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
            session_id = page.url.rsplit("/", 1)[1]
            send_and_wait(page, "echo behind a token")
            item = page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')
            expect(item).to_be_visible()  # the REST list sent the bearer token too


def test_dropped_socket_resumes_the_stream_without_gaps_or_repeats(browser: Browser, tmp_path: Path) -> None:
    words = " ".join(f"part{i}" for i in range(40))
    with running_server(write_config(tmp_path, delay_ms=50)) as base:
        with opened_page(browser, base) as page:
            open_new_chat(page)
            send(page, f"echo {words}")
            expect(page.locator('[data-state="streaming"] .msg-body')).to_contain_text("part3 ")
            page.evaluate("() => window.__spy.sockets.at(-1).close()")
            expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
            expect(page.locator(DONE)).to_have_count(1)
            expect(page.locator(DONE).locator(".msg-body")).to_have_text(words)
            hellos = sent(page, "hello")
            assert len(hellos) == 2 and isinstance(hellos[1].get("last_seq"), int)
            assert hellos[1]["last_seq"] > 0  # the second socket resumed by seq


def test_a_second_tab_sees_the_message_and_reply(browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url) as first, opened_page(browser, base_url) as second:
        session_id = open_new_chat(first)
        second.goto(f"/s/{session_id}")
        expect(second.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
        send_and_wait(first, "echo seen from both tabs")
        expect(second.locator('[data-role="user"]')).to_have_text(["echo seen from both tabs"])
        expect(second.locator(DONE).locator(".msg-body")).to_have_text("seen from both tabs")


def test_a_bad_model_command_shows_an_error_and_the_page_carries_on(page: Page) -> None:
    open_new_chat(page)
    send(page, "/model nowhere/nothing")
    expect(page.locator('[data-role="command"]')).to_have_text("/model nowhere/nothing")
    expect(page.get_by_test_id("error")).to_be_visible()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
    send_and_wait(page, "echo still here")
    expect(page.locator(DONE).last.locator(".msg-body")).to_have_text("still here")


def test_export_import_and_delete_from_the_sidebar(page: Page, base_url: str, tmp_path: Path) -> None:
    session_id = open_new_chat(page)
    send_and_wait(page, "echo worth keeping")
    exported = httpx.get(f"{base_url}/api/sessions/{session_id}/export", params={"format": "json"})
    assert exported.status_code == 200
    dump = tmp_path / "export.json"
    dump.write_bytes(exported.content)

    page.get_by_test_id("import-file").set_input_files(str(dump))
    expect(page).not_to_have_url(re.compile(f"/s/{session_id}$"))
    expect(page.locator(DONE).locator(".msg-body")).to_have_text("worth keeping")
    imported_id = page.url.rsplit("/", 1)[1]

    original = page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')
    expect(original).to_be_visible()
    delete = open_menu(page, session_id).get_by_test_id("session-delete")
    delete.click()
    expect(delete).to_have_text("Really delete?")  # one click never deletes
    delete.click()
    expect(original).to_have_count(0)
    expect(page.locator(f'[data-session-id="{imported_id}"]')).to_be_visible()


def test_a_burst_of_chunks_renders_once_per_frame(page: Page) -> None:
    open_new_chat(page)
    # Each render replaces the reply body's children once; count those replacements.
    renders = page.evaluate(
        """async () => {
            const ws = window.__spy.sockets.at(-1);
            const deliver = (f) => ws.dispatchEvent(new MessageEvent("message", {data: JSON.stringify(f)}));
            let renders = 0;
            const watch = new MutationObserver((records) => {
                for (const r of records) {
                    if (r.target.classList?.contains("msg-body") && r.addedNodes.length) renders++;
                }
            });
            const column = document.querySelector('[data-testid="conversation"]');
            watch.observe(column, {childList: true, subtree: true});
            deliver({type: "accepted", id: "burst", turn_id: "t-burst", content: "burst"});
            for (let i = 0; i < 50; i++) deliver({type: "chunk", turn_id: "t-burst", content: `w${i} `});
            await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
            watch.disconnect();
            return renders;
        }"""
    )
    assert renders == 1
    body = page.locator('[data-turn-id="t-burst"][data-role="assistant"] .msg-body')
    expect(body).to_have_text(" ".join(f"w{i}" for i in range(50)))
    expect(page.get_by_test_id("stop")).to_be_enabled()


def test_shift_enter_makes_a_new_line_and_enter_sends(page: Page) -> None:
    open_new_chat(page)
    box = page.get_by_test_id("message-input")
    box.fill("echo first line")
    box.press("Shift+Enter")
    box.type("second line")
    expect(box).to_have_value("echo first line\nsecond line")
    expect(page.locator('[data-role="user"]')).to_have_count(0)
    box.press("Enter")
    expect(page.locator(DONE).locator(".msg-body")).to_have_text("first line\nsecond line")


def test_model_markdown_cannot_load_remote_images(page: Page, base_url: str) -> None:
    # localhost is another origin than the 127.0.0.1 page: the page's policy must refuse it.
    foreign = base_url.replace("127.0.0.1", "localhost") + "/healthz?tracker=1"
    answered: list[str] = []
    blocked: list[str] = []
    page.on("response", lambda response: answered.append(response.url))
    page.on("requestfailed", lambda request: blocked.append(request.failure or ""))
    open_new_chat(page)
    send_and_wait(page, f"echo look: ![pixel]({foreign})")
    image = page.locator(DONE).last.locator("img")
    expect(image).to_have_count(1)
    page.wait_for_function("(img) => img.complete", arg=image.element_handle())
    assert not [url for url in answered if "tracker=1" in url]
    assert any("CSP" in failure.upper() for failure in blocked), blocked


def test_switching_to_a_smaller_model_shows_the_trim_before_sending(page: Page) -> None:
    open_new_chat(page)
    page.get_by_test_id("model-picker").select_option("demo/demo-open")
    expect(page.get_by_test_id("meter-route")).to_have_text("demo/demo-open")
    for title in ("paper moon", "seventh garden", "spark train"):
        send_and_wait(page, f"look up {title}")
    preview = page.get_by_test_id("trim-preview")
    expect(preview).to_be_hidden()
    page.get_by_test_id("model-picker").select_option("demo/demo-small")
    expect(page.get_by_test_id("meter-window")).to_have_text("4,096")
    expect(preview).to_be_visible()
    expect(preview).to_contain_text(re.compile(r"trim \d+ turns?"))
    send_and_wait(page, "and now?")
    expect(page.get_by_test_id("trim-notice").last).to_be_visible()
    expect(preview).to_be_hidden()

