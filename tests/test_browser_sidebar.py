"""The sidebar pages and searches through the server: with many sessions (imported through the API)
it shows the newest page, loads older ones as the reader scrolls (or presses "Show older chats"),
keeps them through a refresh, and its search box finds a chat by a word of its text, at desktop and
phone size."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser_support import open_new_chat, opened_page, running_server, send_and_wait, write_config

pytestmark = pytest.mark.browser
PAGE = 50  # static/js/sessions.js asks for this many at a time
SESSIONS = 2 * PAGE + 12
SHOTS = os.environ.get("METERCHAT_SHOTS")  # a folder: the test leaves its screenshots there


def document(n: int) -> dict[str, object]:
    text = f"note {n}" + (": the word quetzal lives only here" if n == 7 else "")
    return {"format": "meterchat.session", "version": 1, "title": f"chat {n:03d}", "route": "demo/demo-small",
            "messages": [{"id": f"m{n}", "role": "user", "content": text}]}


def import_many(base: str) -> list[str]:
    """Imported oldest first, so "chat 000" is the oldest session; returns the ids, newest first."""
    with httpx.Client(base_url=base) as http:
        ids = [http.post("/api/sessions/import", json=document(n)).json()["session_id"]
               for n in range(SESSIONS)]
    return ids[::-1]


def shown_ids(page: Page) -> list[str | None]:
    return [item.get_attribute("data-session-id") for item in page.get_by_test_id("session-item").all()]


def open_sidebar(page: Page, phone: bool) -> None:
    if phone:
        page.get_by_test_id("sidebar-toggle").click()
        expect(page.get_by_test_id("sidebar")).to_be_in_viewport()


def shoot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_the_sidebar_pages_on_scroll_and_searches_the_text(
        browser: Browser, tmp_path: Path, size: tuple[int, int]) -> None:
    phone = size[0] < 600
    with running_server(write_config(tmp_path)) as base, \
            opened_page(browser, base, viewport=size, touch=phone) as page:
        ids = import_many(base)
        page.goto("/")
        open_sidebar(page, phone)
        items = page.get_by_test_id("session-item")
        expect(items).to_have_count(PAGE)
        assert shown_ids(page) == ids[:PAGE]  # the newest page, newest first
        older = page.get_by_test_id("sessions-older")
        expect(older).to_have_text("Show older chats")
        shoot(page, f"sidebar-first-page-{size[0]}")
        older.scroll_into_view_if_needed()  # scrolling to the end loads the next page
        expect(items).to_have_count(2 * PAGE)
        items.last.scroll_into_view_if_needed()
        expect(items).to_have_count(SESSIONS)
        expect(older).to_have_count(0)  # nothing older: no button
        assert shown_ids(page) == ids
        shoot(page, f"sidebar-all-{size[0]}")

        search = page.get_by_test_id("session-search")
        search.fill("quetzal")  # a word of one message's text, not of any title
        expect(page.get_by_test_id("session-title")).to_have_text(["chat 007"])
        assert "q=quetzal" in page.evaluate("() => performance.getEntriesByType('resource')"
                                            ".map((e) => e.name).filter((n) => n.includes('q=')).pop()")
        shoot(page, f"sidebar-search-{size[0]}")
        search.fill("chat 0")  # a title search pages too
        expect(items).to_have_count(PAGE)
        expect(older).to_be_attached()
        search.fill("")
        expect(items).to_have_count(PAGE)


def test_the_search_waits_for_the_typing_to_pause(browser: Browser, tmp_path: Path) -> None:
    with running_server(write_config(tmp_path)) as base, opened_page(browser, base) as page:
        import_many(base)
        page.goto("/")
        expect(page.get_by_test_id("session-item")).to_have_count(PAGE)
        page.evaluate("() => performance.clearResourceTimings()")
        page.get_by_test_id("session-search").press_sequentially("quetzal", delay=20)
        expect(page.get_by_test_id("session-title")).to_have_text(["chat 007"])
        asked = page.evaluate("() => performance.getEntriesByType('resource').map((e) => e.name)"
                              ".filter((n) => n.includes('/api/sessions?'))")
        assert len(asked) == 1 and "q=quetzal" in asked[0]  # one request, not one per key


def test_a_refresh_keeps_the_older_pages_shown(browser: Browser, tmp_path: Path) -> None:
    with running_server(write_config(tmp_path)) as base, opened_page(browser, base) as page:
        ids = import_many(base)
        open_new_chat(page)
        items = page.get_by_test_id("session-item")
        page.get_by_test_id("sessions-older").click()
        expect(items).to_have_count(2 * PAGE)
        send_and_wait(page, "echo a new chat")  # stored, then the sidebar refreshes
        expect(items.first).to_contain_text("echo a new chat")
        expect(items).to_have_count(2 * PAGE)  # still as deep as the reader went
        assert shown_ids(page)[1:] == ids[:2 * PAGE - 1]
