"""meterchat as a package: ``python -m build`` makes a wheel and an sdist that carry the page
(``static/``, ``templates/`` as package data), and the wheel, installed into a fresh virtual
environment outside the checkout, serves the page and streams a demo reply."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.processes import STARTED, LoggedProcess
from tests.support import REPO, client, text_of

pytestmark = pytest.mark.anyio

LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], check=True,
                   capture_output=True, timeout=300)
    return out


def test_package_wheel_and_sdist_carry_the_page(dist: Path):
    wheel = zipfile.ZipFile(next(dist.glob("meterchat-*.whl")))
    names = set(wheel.namelist())
    assert {"server/templates/index.html", "server/static/js/app.js", "server/static/style.css",
            "server/web/app.py", "server/history/__init__.py"} <= names
    assert any(name.startswith("server/static/vendor/") for name in names)
    packages = {str(path.relative_to(REPO)) for path in (REPO / "server").rglob("__init__.py")}
    assert packages <= names, "pyproject.toml's packages list misses one"
    assert not any(name.startswith(("tests/", "bench/")) for name in names)
    with tarfile.open(next(dist.glob("meterchat-*.tar.gz"))) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"static/js/app.js", "templates/index.html", "server/web/app.py", "pyproject.toml"} <= members


async def test_package_installed_wheel_serves_the_page_and_a_demo_reply(dist: Path, tmp_path: Path):
    home = tmp_path / "elsewhere"
    venv.create(home / "venv", with_pip=True)
    bin_dir = home / "venv" / "bin"
    wheel = next(dist.glob("meterchat-*.whl"))
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, capture_output=True, timeout=600)
    version = subprocess.run([str(bin_dir / "meterchat"), "--version"], capture_output=True, text=True,
                             check=True, cwd=home)
    assert version.stdout.strip() == "meterchat 0.1.0"
    found = subprocess.run([str(bin_dir / "python"), "-c", "import server; print(server.__file__)"],
                           capture_output=True, text=True, check=True, cwd=home)
    assert Path(found.stdout.strip()).is_relative_to(home)  # the installed copy, not the checkout
    server = LoggedProcess([str(bin_dir / "meterchat"), "--host", "127.0.0.1", "--port", "0",
                            "--log-level", "info"], ready=STARTED, timeout=60, cwd=home)
    try:
        port = next(m.group(1) for m in map(LISTENING.search, server.lines) if m)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            page = await http.get("/")
            script = await http.get("/static/js/app.js")
        assert page.status_code == 200 and "/static/js/app.js" in page.text
        assert script.status_code == 200 and "import" in script.text
        async with client(f"127.0.0.1:{port}") as ws:
            await ws.hello()
            frames = await ws.say("hello from a wheel")
        assert frames[-1]["type"] == "done" and text_of(frames)
        assert (home / "meterchat-data").is_dir()  # the data folder is the working directory's
    finally:
        server.stop()
