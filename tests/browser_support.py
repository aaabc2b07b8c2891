"""Helpers for the browser tests: a real meterchat server in a subprocess and Debian's chromium.

The server is started the way a user starts it (``python -m server --config F``, through
``tests.support.run_server``) on a free loopback port with its own data folder; Playwright drives
the system chromium and never downloads a browser of its own.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import pytest
from playwright.sync_api import Browser, Locator, Page, Playwright, expect, sync_playwright

from tests.support import run_server

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ASSISTANT = '[data-role="assistant"]'
DONE = '[data-role="assistant"][data-state="done"]'

# Installed before the page's scripts: records every socket the page opens and every frame it sends
# and receives, so tests read the real traffic instead of hooks in the page's code.
SOCKET_SPY = """
(() => {
  const Native = window.WebSocket;
  const spy = { sockets: [], sent: [], received: [] };
  window.__spy = spy;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      spy.sockets.push(this);
      this.addEventListener("message", (event) => {
        try { spy.received.push(JSON.parse(event.data)); } catch { /* not JSON */ }
      });
    }
    send(data) {
      try { spy.sent.push(JSON.parse(data)); } catch { /* not JSON */ }
      super.send(data);
    }
  };
})();
"""


def feed(page: Page, frame: dict[str, object]) -> None:
    """Deliver a server frame the demo cannot produce on cue, through the page's open socket."""
    page.evaluate(
        """(frame) => {
            const ws = window.__spy.sockets.at(-1);
            ws.dispatchEvent(new MessageEvent("message", {data: JSON.stringify(frame)}));
        }""",
        frame,
    )


def received(page: Page, frame_type: str) -> list[dict[str, object]]:
    """The frames of one type the page has received so far, oldest first."""
    frames: list[dict[str, object]] = page.evaluate(
        "(type) => window.__spy.received.filter((f) => f.type === type)", frame_type)
    return frames


def sent(page: Page, frame_type: str) -> list[dict[str, object]]:
    frames: list[dict[str, object]] = page.evaluate(
        "(type) => window.__spy.sent.filter((f) => f.type === type)", frame_type)
    return frames


def write_config(folder: Path, *, delay_ms: int = 5, extra: str = "",
                 runtime: str = "context_compact_ratio = 0.6", providers: str = "") -> Path:
    """The demo on ``folder``; ``extra`` goes into ``[server]``, ``providers`` after the demo's
    own keys (more of its keys, or more providers)."""
    config = folder / "meterchat.toml"
    config.write_text(
        f"""
[server]
data_dir = "{(folder / "data").as_posix()}"
{extra}
[runtime]
{runtime}

[providers.demo]
kind = "demo"
model = "demo-small"
context_window = 4096
models = {{ "demo-open" = 0 }}
delay_ms = {delay_ms}
{providers}
""",
        encoding="utf-8",
    )
    return config


@contextmanager
def running_server(config: Path) -> Iterator[str]:
    """Start the server on a free port; yield its base URL; stop it afterwards."""
    with run_server(config) as server:
        yield server.url


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise RuntimeError("Debian's chromium is needed for the browser tests (scripts/test installs it)")
    return path


@contextmanager
def opened_page(browser: Browser, base: str, *, viewport: tuple[int, int] = (1100, 800),
                color_scheme: Literal["light", "dark"] = "light", touch: bool = False) -> Iterator[Page]:
    """A page in its own browser context; an uncaught error in the page's JavaScript fails the test.

    ``touch`` makes a phone: touch events, no hover, a coarse pointer.
    """
    width, height = viewport
    context = browser.new_context(base_url=base, viewport={"width": width, "height": height},
                                  color_scheme=color_scheme, has_touch=touch, is_mobile=touch)
    context.add_init_script(SOCKET_SPY)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def open_new_chat(page: Page) -> str:
    page.goto("/")
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-status", "online")
    expect(page).to_have_url(re.compile(r"/s/[^/]+$"))
    return page.url.rsplit("/", 1)[1]


def send(page: Page, text: str) -> None:
    expect(page.get_by_test_id("send")).to_be_enabled()
    box = page.get_by_test_id("message-input")
    box.fill(text)
    box.press("Enter")


def open_menu(page: Page, session_id: str) -> Locator:
    """Open a sidebar row's action menu; return the row."""
    item = page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')
    item.get_by_test_id("session-menu-button").click()
    expect(item.get_by_test_id("session-menu")).to_be_visible()
    return item


def send_and_wait(page: Page, text: str) -> None:
    done_before = page.locator(DONE).count()
    send(page, text)
    expect(page.locator(DONE)).to_have_count(done_before + 1)


# Fixtures of every browser test module (loaded as a plugin by tests/conftest.py): one browser and one
# server on the demo per module, a fresh page per test.
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
