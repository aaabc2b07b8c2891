"""Accounts for tests: users made through the directory (as ``meterchat users add`` does) and signed
in over real HTTP, so a test holds each user's cookie as a browser would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from server.accounts.directory import Directory
from server.store.backends import open_store
from server.web.auth import COOKIE

PASSWORD = "correct horse battery"


async def add_users(data_dir: Path | str, *names: str, url: str = "") -> None:
    """Make the accounts (the first one an admin) in the store at ``data_dir`` / ``url``."""
    store = open_store(data_dir, url)
    try:
        for name in names:
            await Directory(store).add(name, PASSWORD)
    finally:
        await store.close()


async def run_in_store(data_dir: Path | str, step: Any, url: str = "") -> Any:
    """``step(Directory)`` against the store, from outside the server (another process would do the
    same: ``meterchat users disable``)."""
    store = open_store(data_dir, url)
    try:
        return await step(Directory(store))
    finally:
        await store.close()


async def sign_in(address: str, name: str, password: str = PASSWORD) -> str:
    """The sign-in cookie's value for ``name``."""
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as http:
        answer = await http.post("/api/auth/signin", json={"name": name, "password": password})
    assert answer.status_code == 200, answer.text
    return answer.cookies[COOKIE]


def cookie_header(cookie: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={cookie}"}


def http_as(address: str, cookie: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://{address}", timeout=10, headers=cookie_header(cookie))
