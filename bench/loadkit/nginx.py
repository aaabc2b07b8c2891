"""A private nginx in front of meterchat instances, run from the operators' own ``deploy/nginx.conf``.

``render_site`` changes only what differs between machines: the ``listen`` line (a port on
127.0.0.1) and the upstream ``server`` lines (one per instance, keeping their parameters).
``write_config`` wraps that site file, as nginx's http context does on a real install, with what a
private run needs: its temporary directories under its own folder, no access log, and room for a
thousand sockets. ``command`` is the nginx command line (foreground, its pid file and error log in
the folder, user nobody when started as root). Used by bench/load.py --instances and
tests/test_nginx.py, so the configuration measured is the one tested and the one copied.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONF = ROOT / "deploy" / "nginx.conf"
INSTALL_HINT = ("nginx is not installed: tests/test_nginx.py and bench/load.py --instances need "
                "Debian's nginx (scripts/test installs it; or: apt-get install nginx)")
READY = "start worker process"  # logged at notice level once the master has bound its ports

_UPSTREAM_SERVER = re.compile(r"^([ \t]*)server[ \t]+[^\s;]+:\d+([^;\n]*);\n", re.MULTILINE)
_LISTEN = re.compile(r"^([ \t]*)listen 80;$", re.MULTILINE)
_TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def binary() -> str:
    found = shutil.which("nginx") or next(
        (path for path in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(path, os.X_OK)), None)
    if found is None:
        raise FileNotFoundError(INSTALL_HINT)
    return found


def render_site(text: str, upstreams: list[str], port: int) -> str:
    """``text`` (deploy/nginx.conf) listening on 127.0.0.1:``port`` with ``upstreams`` as servers."""
    servers = list(_UPSTREAM_SERVER.finditer(text))
    if not servers or len(_LISTEN.findall(text)) != 1:
        raise ValueError("deploy/nginx.conf changed shape: expected upstream 'server host:port ...;' "
                         "lines and one 'listen 80;' (update bench/loadkit/nginx.py)")
    indent, params = servers[0].group(1), servers[0].group(2)
    block = "".join(f"{indent}server {address}{params};\n" for address in upstreams)
    start, end = servers[0].start(), servers[-1].end()
    text = text[:start] + block + _UPSTREAM_SERVER.sub("", text[start:end]) + text[end:]
    return _LISTEN.sub(rf"\1listen 127.0.0.1:{port};", text)


def make_folder() -> Path:
    """A folder nginx's workers can enter when they run as nobody (pytest's own are root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="meterchat-nginx-"))
    folder.chmod(0o755)
    return folder


def write_config(folder: Path, upstreams: list[str], port: int) -> Path:
    """The main file nginx is started with: the site file included in a private http context."""
    site = folder / "meterchat.conf"
    site.write_text(render_site(DEPLOY_CONF.read_text(), upstreams, port))
    temp = "".join(f"    {name}_temp_path {folder / name};\n" for name in _TEMP_DIRS)
    main = folder / "nginx.conf"
    main.write_text("worker_processes 1;\n"
                    "events {\n    worker_connections 16384;\n}\n"
                    f"http {{\n    access_log off;\n{temp}    include {site};\n}}\n")
    return main


def command(folder: Path, config: Path) -> list[str]:
    """Foreground nginx logging to stderr (where its readiness line is read)."""
    directives = f"daemon off; pid {folder / 'nginx.pid'}; error_log stderr notice;"
    if os.geteuid() == 0:
        directives += " user nobody nogroup;"
    return [binary(), "-e", "stderr", "-p", str(folder), "-c", str(config), "-g", directives]
