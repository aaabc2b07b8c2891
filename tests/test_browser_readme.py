"""The README's picture of the page, made by a real browser on the demo so it stays current: a
conversation mid-way, a trim notice in the transcript and the meter's breakdown open."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.browser_support import open_new_chat, opened_page, running_server, send_and_wait, write_config

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshot.png"


def test_readme_screenshot_shows_a_trim_and_the_open_meter(browser: Browser, tmp_path: Path) -> None:
    with running_server(write_config(tmp_path)) as url, \
            opened_page(browser, url, viewport=(1280, 800)) as page:
        open_new_chat(page)
        send_and_wait(page, "hello, who are you?")
        for title in ["paper moon", "harbour letters", "seventh garden", "spark train", "chess in the rain"]:
            send_and_wait(page, f"please look up {title}")
            if page.get_by_test_id("trim-notice").count():
                break
        expect(page.get_by_test_id("trim-notice").first).to_be_visible()
        page.get_by_test_id("trim-notice").first.scroll_into_view_if_needed()
        page.get_by_test_id("meter-toggle").click()
        expect(page.get_by_test_id("breakdown-tokens")).to_be_visible()
        page.screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 10_000
