"""The sign-in page in Debian's chromium (``[auth] mode = "accounts"``): a stranger is sent to it, a
wrong password is told so, the right one opens the chat as the user, sign-out returns to it, and a
user disabled from the command line is sent back to it by the open page's socket (4401)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.accounts_support import PASSWORD
from tests.browser_support import opened_page, running_server, send_and_wait, write_config

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("accounts")


@pytest.fixture(scope="module")
def config(folder: Path) -> Path:
    path = write_config(folder, extra='\n[auth]\nmode = "accounts"\nrevocation_check_ms = 200\n')
    for name in ("alice", "bob", "carol"):  # as an administrator would: the command line, stdin
        users(path, "add", name, stdin=PASSWORD + "\n")
    return path


@pytest.fixture(scope="module")
def base_url(config: Path) -> Iterator[str]:
    with running_server(config) as url:
        yield url


def users(config: Path, *args: str, stdin: str = "") -> None:
    subprocess.run([sys.executable, "-m", "server", "users", "--config", str(config), *args], input=stdin,
                   text=True, check=True, capture_output=True, timeout=60, cwd=REPO)


def sign_in(page: Page, name: str, password: str = PASSWORD) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/signin$"))
    page.get_by_test_id("signin-name").fill(name)
    page.get_by_test_id("signin-password").fill(password)
    page.get_by_test_id("signin-submit").click()


def test_browser_signin_wrong_then_right_password_then_sign_out(page: Page) -> None:
    sign_in(page, "alice", "not the password")
    expect(page.get_by_test_id("signin-error")).to_contain_text("wrong name or password")
    page.get_by_test_id("signin-password").fill(PASSWORD)
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
    expect(page.get_by_test_id("account-name")).to_have_text("alice")
    send_and_wait(page, "echo only alice reads this")
    page.get_by_test_id("message-input").fill("a draft only alice may read")
    assert "only alice may read" in page.evaluate("() => localStorage.getItem('meterchat.drafts')")
    page.get_by_test_id("sign-out").click()
    expect(page).to_have_url(re.compile(r"/signin$"))
    assert page.evaluate("() => localStorage.getItem('meterchat.drafts')") is None  # not left for the next
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/signin$"))  # the cookie no longer opens the chat


def test_browser_signin_another_user_sees_none_of_it(browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url) as alice:
        sign_in(alice, "alice")
        send_and_wait(alice, "echo a secret of alice")
        secret_url = alice.url
    with opened_page(browser, base_url) as bob:
        sign_in(bob, "bob")
        expect(bob.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
        bob.goto(secret_url.replace(base_url, ""))
        expect(bob.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
        expect(bob.get_by_test_id("session-list")).not_to_contain_text("a secret of alice")
        expect(bob.get_by_test_id("conversation")).not_to_contain_text("a secret of alice")
        assert bob.url != secret_url


def test_browser_signin_a_disabled_user_is_sent_back_to_sign_in(page: Page, config: Path) -> None:
    sign_in(page, "carol")
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
    users(config, "disable", "carol")
    expect(page).to_have_url(re.compile(r"/signin$"))


@pytest.mark.parametrize("viewport", [(1280, 800), (390, 844)])
def test_browser_signin_page_looks(browser: Browser, base_url: str, viewport: tuple[int, int],
                                   tmp_path: Path) -> None:
    with opened_page(browser, base_url, viewport=viewport) as page:
        page.goto("/signin")
        card = page.locator(".signin-card")
        expect(card).to_be_visible()
        box = card.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport[0]
        page.screenshot(path=str(tmp_path / f"signin-{viewport[0]}.png"))
