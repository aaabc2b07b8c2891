"""What the page shows of the meter's truth (issue 10), in a real browser against the real server on
the embedded demo: the figure after a reply is the next send's, an unpublished window is told in
words with a labelled budget marker (on a phone too), a tool loop's footer says how many calls it
sums, a switch is confirmed in the conversation, and unknown commands are answered."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser_support import (
    DONE,
    open_new_chat,
    opened_page,
    received,
    send,
    send_and_wait,
)

pytestmark = pytest.mark.browser


def test_meter_after_a_reply_shows_the_next_send(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "echo " + "word " * 400)
    done_meter = [f for f in received(page, "context") if f["reason"] == "done"]
    assert done_meter, "the server sends the next send's figure when a turn ends"
    figure = done_meter[-1]["estimated_tokens"]
    last_input = received(page, "done")[-1]["last_input_tokens"]
    assert isinstance(figure, int) and isinstance(last_input, int) and figure > last_input + 300
    expect(page.get_by_test_id("meter-used")).to_have_text(f"~{figure:,}")  # an estimate: the reply was added


def test_unpublished_window_is_told_in_words_with_a_labelled_marker_on_a_phone(
        browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url, viewport=(390, 800), touch=True) as page:
        open_new_chat(page)
        page.get_by_test_id("model-picker").select_option("demo/demo-open")
        numbers = page.locator(".meter-numbers")
        # context_compact_ratio 0.6 of the 32,000 fallback: a 19,200-token budget
        expect(numbers).to_have_text(re.compile(r"^~?[\d,]+ of a 19,200 budget; window not published \d+%$"))
        label = page.get_by_test_id("meter-budget-label")
        expect(label).to_be_visible()
        expect(label).to_have_text("budget 19,200")
        expect(page.get_by_test_id("meter-budget-marker")).to_be_visible()
        page.get_by_test_id("meter-toggle").tap()
        expect(page.get_by_test_id("breakdown-marker")).to_contain_text("starts dropping the oldest turns")
        expect(page.get_by_test_id("breakdown-window")).to_contain_text("not published")


def test_known_window_labels_where_trimming_starts(page: Page) -> None:
    open_new_chat(page)
    expect(page.locator(".meter-numbers")).to_have_text(re.compile(r"^~?[\d,]+ / 4,096 tokens \d+%$"))
    expect(page.get_by_test_id("meter-budget-label")).to_have_text("trims at 2,457")


def test_a_tool_loop_footer_says_how_many_calls_it_sums(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "look up paper moon")
    foot = page.locator(DONE).last.locator(".msg-foot")
    expect(foot).to_have_text(re.compile(r"^[\d,]+ in \(2 calls\) · [\d,]+ out$"))


def test_a_switch_is_confirmed_with_the_window_and_unknown_commands_are_answered(page: Page) -> None:
    open_new_chat(page)
    send(page, "/model demo/demo-open")
    switched = page.locator('[data-testid="notice"][data-code="switched"]')
    expect(switched).to_have_text(re.compile(r"^Switched to demo/demo-open: its window is not published; "
                                             r"meterchat trims to a 19,200-token budget"))
    send(page, "/model")
    unknown = page.locator('[data-testid="notice"][data-code="unknown_route"]')
    expect(unknown).to_contain_text("demo/demo-small")
    send(page, "/model demo/demo-small")
    expect(switched.last).to_contain_text("its window is 4,096 tokens")
    send_and_wait(page, "/hint nowhere say hi")
    hint = page.locator('[data-testid="notice"][data-code="unknown_hint"]')
    expect(hint).to_contain_text("No route has the hint 'nowhere'")


def test_the_sidebar_search_finds_a_chat_by_its_text(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "echo alpha")
    send_and_wait(page, "echo a zebra crossing")  # the title stays "echo alpha"
    titles = page.get_by_test_id("session-title")
    expect(titles.filter(has_text="echo alpha")).to_have_count(1)
    page.get_by_test_id("session-search").fill("zebra")
    expect(titles).to_have_text(["echo alpha"])  # found by its text, not its title
    page.get_by_test_id("session-search").fill("quokka-nowhere")
    expect(page.get_by_test_id("session-list")).to_contain_text("No chat matches.")
