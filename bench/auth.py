"""What accounts cost: a REST request signed in (cookie or API token) against one with no sign-in, and
the revocation check that watches every open socket of a process.

Run ``python bench/auth.py [--requests 400] [--sockets 2000] [--quick]``. Three servers
(``python -m server``, the demo provider, SQLite) are started in the same run: ``[auth] mode`` none
(the baseline), and accounts, asked with a sign-in cookie and with an API token. Each answers
``--requests`` sequential ``GET /api/sessions`` from one kept-alive connection; the bench prints
requests per second (best of three interleaved rounds) and the ratio to the baseline. Then
``live_logins`` (the one query the revocation task runs every ``revocation_check_ms`` for all the
sockets of a process) is timed with
``--sockets`` sign-ins on the SQLite store. Prints figures and ratios; asserts nothing. ``--quick``:
60 requests and 200 sign-ins, to check the bench still runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.accounts.directory import Directory  # noqa: E402
from server.store.backends import open_store  # noqa: E402
from server.store.users import utc_now  # noqa: E402

PASSWORD = "correct horse battery"
REPEATS = 3
LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


def config(folder: Path, mode: str) -> Path:
    path = folder / f"{mode}.toml"
    path.write_text(f'[server]\ndata_dir = "{folder / mode}"\n[auth]\nmode = "{mode}"\n', encoding="utf-8")
    return path


def start(path: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "server", "--config", str(path), "--port", "0",
                                "--log-level", "info"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        found = LISTENING.search(line)
        if found:  # the rest is read (and dropped) so the access log never fills the pipe
            threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
            return process, f"http://127.0.0.1:{found.group(1)}"
    raise RuntimeError(f"{path.name}: the server did not start")


def _drain(stream: Any) -> None:
    try:
        for _ in stream:
            pass
    except ValueError:  # closed under the loop once the server stopped
        pass


def rate(base: str, count: int, headers: dict[str, str]) -> float:
    with httpx.Client(base_url=base, headers=headers) as http:
        http.get("/api/sessions").raise_for_status()  # warm
        started = time.perf_counter()
        for _ in range(count):
            http.get("/api/sessions").raise_for_status()
        return count / (time.perf_counter() - started)


def signed_in(base: str) -> tuple[dict[str, str], dict[str, str]]:
    with httpx.Client(base_url=base) as http:  # the client keeps the cookie for the second call
        cookie = http.post("/api/auth/signin", json={"name": "alice", "password": PASSWORD}).cookies
        token = http.post("/api/auth/tokens", json={"name": "bench"}).json()["token"]
    return ({"Cookie": "; ".join(f"{k}={v}" for k, v in cookie.items())},
            {"Authorization": f"Bearer {token}"})


async def revocation_check(folder: Path, sockets: int) -> float:
    store = open_store(folder / "revocation")
    try:
        user = await Directory(store).add("alice", PASSWORD)
        keys = [f"key{n}" for n in range(sockets)]
        for key in keys:
            await store.create_login(key, user.id, utc_now(3600))
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for start_at in range(0, len(keys), 500):  # the batches server.web.revocation sends
                await store.live_logins(keys[start_at:start_at + 500], utc_now())
            best = min(best, time.perf_counter() - started)
        return best
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--sockets", type=int, default=2000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    requests, sockets = (60, 200) if args.quick else (args.requests, args.sockets)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        anyio.run(_add_alice, folder / "accounts")
        plain, plain_url = start(config(folder, "none"))
        accounts, accounts_url = start(config(folder, "accounts"))
        try:
            cookie, token = signed_in(accounts_url)
            variants = {"no sign-in": (plain_url, {}), "cookie": (accounts_url, cookie),
                        "API token": (accounts_url, token)}
            rates = {name: 0.0 for name in variants}
            for _ in range(REPEATS):  # interleaved, best of each: the machine's noise hits them alike
                for name, (base, headers) in variants.items():
                    rates[name] = max(rates[name], rate(base, requests, headers))
        finally:
            for process in (plain, accounts):
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
                if process.stdout is not None:
                    process.stdout.close()
        check = anyio.run(revocation_check, folder, sockets)
    baseline = rates["no sign-in"]
    print(f"GET /api/sessions, {requests} sequential requests (a shared machine: ratios, not absolutes)")
    for name, value in rates.items():
        print(f"  {name:<11} {value:8.0f} req/s   {value / baseline:5.2f}x the baseline")
    print(f"revocation check of {sockets} sign-ins (SQLite, batches of 500): {check * 1000:.1f} ms "
          f"per round, {check * 1000 / 500 * 100:.1f}% of a 500 ms interval")


async def _add_alice(data_dir: Path) -> None:
    store = open_store(data_dir)
    try:
        await Directory(store).add("alice", PASSWORD)
    finally:
        await store.close()


if __name__ == "__main__":
    main()
