"""How the page looks and reads: axe-core on the main states, light and dark, desktop and phone.

axe-core is vendored under tests/vendor/ and evaluated inside the page under test; the page never
loads it. Each state is also saved as a PNG in the test's tmp_path, for a person to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.browser_support import (
    CHROMIUM_ARGS,
    DONE,
    chromium_path,
    open_menu,
    open_new_chat,
    opened_page,
    running_server,
    send_and_wait,
    write_config,
)

pytestmark = pytest.mark.browser

AXE = (Path(__file__).resolve().parent / "vendor" / "axe.min.js").read_text(encoding="utf-8")
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
Scheme = Literal["light", "dark"]
SCHEMES: list[Scheme] = ["light", "dark"]


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


def serious_violations(page: Page) -> list[str]:
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE)
    found: list[dict[str, object]] = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
            .filter((v) => v.impact === "serious" || v.impact === "critical")
            .map((v) => ({id: v.id, nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 3)}))"""
    )
    return [f"{v['id']}: {v['nodes']}" for v in found]


def check(page: Page, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}.png"))
    assert serious_violations(page) == [], name


def fill_a_conversation(page: Page) -> None:
    send_and_wait(page, "echo ```python\ndef greet(name):\n    return 'hi ' + name\n```")
    for title in ["paper moon", "harbour letters", "seventh garden", "spark train", "chess in the rain"]:
        send_and_wait(page, f"please look up {title}")
        if page.get_by_test_id("trim-notice").count():
            break
    expect(page.get_by_test_id("trim-notice").first).to_be_visible()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_main_states_pass_axe(browser: Browser, base_url: str, tmp_path: Path, scheme: Scheme,
                              size: str) -> None:
    phone = size == "phone"
    with opened_page(browser, base_url, viewport=VIEWPORTS[size], color_scheme=scheme, touch=phone) as page:
        session_id = open_new_chat(page)
        expect(page.get_by_test_id("welcome")).to_be_visible()
        check(page, tmp_path, f"{size}-{scheme}-welcome")
        fill_a_conversation(page)
        page.get_by_test_id("meter-toggle").click()
        expect(page.get_by_test_id("meter-breakdown")).to_be_visible()
        check(page, tmp_path, f"{size}-{scheme}-conversation")
        if phone:
            page.get_by_test_id("sidebar-toggle").click()
        open_menu(page, session_id)
        check(page, tmp_path, f"{size}-{scheme}-menu")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_page_follows_the_system_theme(browser: Browser, base_url: str, scheme: Scheme) -> None:
    with opened_page(browser, base_url, color_scheme=scheme) as page:
        open_new_chat(page)
        send_and_wait(page, "echo ```js\nconst x = 'y';\n```")
        background = page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
        dark = background == "rgb(23, 24, 27)"
        assert dark == (scheme == "dark"), background
        keyword = page.locator(DONE).last.locator(".hljs-keyword").first
        expect(keyword).to_have_text("const")
        colour = keyword.evaluate("(el) => getComputedStyle(el).color")
        assert colour == ("rgb(208, 156, 242)" if scheme == "dark" else "rgb(138, 63, 184)")


def test_a_phone_shows_actions_without_hover_and_fits_the_width(browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url, viewport=VIEWPORTS["phone"], touch=True) as page:
        open_new_chat(page)
        send_and_wait(page, "echo a reply on a small screen with a rather long line of text in it to wrap")
        expect(page.locator(".msg-row.assistant .msg-actions").last).to_have_css("opacity", "1")
        page.get_by_test_id("meter-toggle").tap()
        expect(page.get_by_test_id("meter-breakdown")).to_be_visible()
        for testid in ("message-input", "send", "meter-toggle"):
            expect(page.get_by_test_id(testid)).to_be_in_viewport()
        assert page.evaluate("() => document.documentElement.scrollWidth") <= VIEWPORTS["phone"][0]


def test_the_token_form_passes_axe(browser: Browser, tmp_path: Path) -> None:
    with running_server(write_config(tmp_path, extra='auth_token = "sesame-axe"')) as base:
        with opened_page(browser, base) as page:
            page.goto("/")
            expect(page.get_by_test_id("token-form")).to_be_visible()
            check(page, tmp_path, "token-form")
