"""``meterchat users ...`` as an administrator runs it: a child process, the password on stdin (never
on the command line), the first account an admin, every change visible in the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.accounts.passwords import verify
from tests.accounts_support import run_in_store

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parent.parent


def users(config: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server", "users", "--config", str(config), *args],
                          input=stdin, capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "meterchat.toml"
    path.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n[auth]\nmode = "accounts"\n')
    return path


async def test_users_cli_adds_lists_and_changes_accounts(config: Path, tmp_path: Path) -> None:
    assert users(config, "add", "alice", stdin="first password\n").stdout.strip() == "added alice (admin)"
    assert "added bob (user)" in users(config, "add", "bob", "--email", "bob@example.com",
                                       stdin="bobs password\n").stdout
    listed = users(config, "list").stdout.splitlines()
    assert [line.split("\t")[:3] for line in listed] == [["alice", "admin", "-"],
                                                         ["bob", "user", "bob@example.com"]]
    assert users(config, "passwd", "alice", stdin="second password\n").returncode == 0
    alice = await run_in_store(tmp_path / "data", lambda d: d.named("alice"))
    assert await verify(alice.password_hash, "second password")
    assert "disabled" in users(config, "disable", "bob").stdout
    assert "user disabled" in users(config, "list").stdout.splitlines()[1]
    assert "removed bob and 0 session(s)" in users(config, "remove", "bob").stdout
    assert "name\trole\tsessions" in users(config, "usage").stdout


async def test_users_cli_refuses_a_password_on_the_command_line_and_bad_input(config: Path) -> None:
    on_argv = users(config, "add", "alice", "--password", "visible to ps")
    short = users(config, "add", "alice", stdin="short\n")
    missing = users(config, "passwd", "nobody", stdin="long enough\n")
    assert on_argv.returncode == 2 and "unrecognized arguments" in on_argv.stderr
    assert short.returncode == 1 and "password: expected 8 to" in short.stderr
    assert missing.returncode == 1 and "no account named 'nobody'" in missing.stderr
    assert users(config, "list").stdout == ""
