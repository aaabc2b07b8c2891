"""Single sign-on end to end in Debian's chromium: meterchat (a child process) signs people in through a
real OpenID Connect provider process (``oidc-provider-mock``: discovery, the authorization form, the
code exchange, signed ID tokens); the admin claim makes an admin, another person is a user who sees
none of the admin's chats, and a disabled account is sent back with a clear message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser_support import opened_page, running_server, send_and_wait, write_config
from tests.processes import LoggedProcess
from tests.redis_support import free_port

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parent.parent
SECRET_ENV = "METERCHAT_TEST_OIDC_SECRET"
PEOPLE = [{"sub": "alice-0001", "preferred_username": "alice", "email": "alice@example.com",
           "groups": ["staff", "chat-admins"]},
          {"sub": "bob-0002", "preferred_username": "bob", "email": "bob@example.com", "groups": ["staff"]}]


@pytest.fixture(scope="module")
def issuer() -> Iterator[str]:
    port = free_port()
    claims = [arg for person in PEOPLE for arg in ("--user-claims", json.dumps(person))]
    provider = LoggedProcess([sys.executable, "-m", "oidc_provider_mock", "--port", str(port), *claims],
                             "Uvicorn running on")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, issuer: str) -> Path:
    return write_config(tmp_path_factory.mktemp("oidc"), extra=(
        f'\n[auth]\nmode = "accounts"\noidc_issuer = "{issuer}"\noidc_client_id = "meterchat"\n'
        f'oidc_client_secret_env = "{SECRET_ENV}"\noidc_admin_claim = "groups"\n'
        'oidc_admin_values = ["chat-admins"]\n'))


@pytest.fixture(scope="module")
def base_url(config: Path) -> Iterator[str]:
    os.environ[SECRET_ENV] = "a client secret"  # the child server reads it from its environment
    try:
        with running_server(config) as url:
            yield url
    finally:
        del os.environ[SECRET_ENV]


def sso(page: Page, sub: str) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/signin$"))
    page.get_by_test_id("signin-sso").click()
    page.get_by_role("button", name=sub, exact=True).click()  # the provider's form: this person


def me(page: Page) -> dict[str, object]:
    user: dict[str, object] = page.evaluate("fetch('/api/auth/me').then((r) => r.json())")["user"]
    return user


def test_browser_oidc_admin_claim_makes_an_admin_and_others_see_nothing_of_theirs(
        browser: Browser, base_url: str) -> None:
    with opened_page(browser, base_url) as page:
        sso(page, "alice-0001")
        expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
        expect(page.get_by_test_id("account-name")).to_have_text("alice")
        assert me(page)["role"] == "admin" and me(page)["email"] == "alice@example.com"
        send_and_wait(page, "echo signed in through the provider")
        secret_url = page.url
    with opened_page(browser, base_url) as page:
        sso(page, "bob-0002")
        expect(page.get_by_test_id("account-name")).to_have_text("bob")
        assert me(page)["role"] == "user"
        page.goto(secret_url.replace(base_url, ""))
        expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
        expect(page.get_by_test_id("conversation")).not_to_contain_text("signed in through the provider")
        expect(page.get_by_test_id("session-list")).not_to_contain_text("signed in through the provider")


def test_browser_oidc_a_disabled_account_is_told_so(browser: Browser, base_url: str, config: Path) -> None:
    with opened_page(browser, base_url) as page:
        sso(page, "bob-0002")  # the account exists (made on its first sign-in)
        expect(page.get_by_test_id("account-name")).to_have_text("bob")
    subprocess.run([sys.executable, "-m", "server", "users", "--config", str(config), "disable", "bob"],
                   check=True, capture_output=True, timeout=60, cwd=REPO)
    with opened_page(browser, base_url) as page:
        sso(page, "bob-0002")
        expect(page).to_have_url(re.compile(r"/signin\?error=disabled$"))
        expect(page.get_by_test_id("signin-error")).to_have_text("This account is disabled.")
