"""``meterchat [--config PATH] [--host HOST] [--port PORT] [--workers N]``: start the server;
``meterchat users ...``: manage accounts (``server.accounts.cli``).

Without ``--config`` the server starts on the embedded offline demo provider. A bad settings file
stops start-up with a message naming the key. ``--workers`` runs several processes on one socket
(server.web.workers).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from importlib import metadata
from typing import Any, TypeVar

import anyio
import uvicorn

from server.config.load import load_settings
from server.config.settings import Settings
from server.errors import ConfigError
from server.routing.resolver import RouteResolver
from server.web.access import exposure_problem
from server.web.serving import DrainingServer, redact_logs, uvicorn_options
from server.web.workers import WORKER_HEADER, WorkerServer, supervise, worker_count
from server.web.ws_guard import LingeringWebSocketProtocol

T = TypeVar("T")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="meterchat", description="Start the meterchat server (the offline demo without --config).",
        epilog="meterchat users --help: accounts ([auth] mode = \"accounts\"): add, list, passwd, "
               "disable, enable, remove, usage.")
    parser.add_argument("--version", action="version", version=f"meterchat {installed_version()}")
    parser.add_argument("--config", help="TOML settings file (default: the embedded demo)")
    parser.add_argument("--host", help="interface to listen on (overrides [server] host)")
    parser.add_argument("--port", type=int, help="TCP port (overrides [server] port; 0 = any free)")
    parser.add_argument("--workers", type=worker_count, default=1, metavar="N",
                        help="worker processes on one socket (auto or 0 = one per core; more than "
                             "one needs [live] url)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="serve a non-loopback address without an auth token (a proxy authenticates)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    # Set by the --workers supervisor for each worker it starts (server.web.workers), not by hand.
    parser.add_argument("--worker-socket", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def installed_version() -> str:
    try:
        return metadata.version("meterchat")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["users"]:  # accounts on the command line (server.accounts.cli)
        from server.accounts.cli import main as users_main

        raise SystemExit(users_main(argv[1:]))
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = checked(lambda: load_settings(args.config))
    checked(lambda: RouteResolver(settings, {}))  # model_routes and the default route resolve
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    if args.worker_socket is not None:  # the supervisor refused an exposed bind already
        return serve_worker(args, settings, host, port)
    refuse_exposure(host, settings.server.auth_token, args.insecure_no_auth, settings.auth_mode)
    if args.workers > 1:
        def prepare() -> None:
            checked(lambda: prepare_store(settings))

        raise SystemExit(supervise(args, settings, host, port, prepare=prepare))
    settings, app = build_app(settings, host, port)
    print(f"meterchat: serving on http://{host}:{port}/ ({settings.source}; default route "
          f"{settings.default_route})", file=sys.stderr, flush=True)
    DrainingServer(uvicorn_config(app, settings, args.log_level), app).run()


def checked(step: Callable[[], T]) -> T:
    """A start-up step whose ConfigError stops the server with one line naming the key."""
    try:
        return step()
    except ConfigError as exc:
        print(f"meterchat: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def prepare_store(settings: Settings) -> None:
    """Workers start together: the store is created, migrated and checked once, here, so they do
    not race for a new SQLite file's first write lock ("database is locked" stopped one of two)."""
    from server.store.backends import open_store

    store = open_store(settings.server.data_dir, settings.store.url, settings.store.pool_size,
                       settings.store.timeout_seconds)
    anyio.run(store.close)


def build_app(settings: Settings, host: str, port: int) -> tuple[Settings, Any]:
    from server.web.app import create_app

    # The Host allow-list admits the bound address: it must be the one actually bound.
    settings = replace(settings, server=replace(settings.server, host=host, port=port))
    return settings, checked(lambda: create_app(settings))  # an unusable database stops start-up here


def uvicorn_config(app: Any, settings: Settings, log_level: str,
                   headers: list[tuple[str, str]] | None = None) -> uvicorn.Config:
    # No per-message deflate: chat frames are small and many, so compressing each costs more CPU
    # than it saves on a local or LAN link. Loop and WebSocket implementation were chosen by
    # bench/load.py (docs/performance.md): "auto" takes uvloop where pyproject installs it. The HTTP
    # parser is h11 with a deadline on request heads (server.web.serving.guarded_h11, slowloris).
    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port,
                            log_level=log_level, loop="auto", ws=LingeringWebSocketProtocol,
                            ws_max_size=16 * 1024 * 1024, ws_per_message_deflate=False,
                            headers=headers or [], **uvicorn_options(settings.server),
                            # header mode trusts a peer address: it must be the real peer, not one
                            # an X-Forwarded-For rewrote
                            proxy_headers=settings.auth_mode != "header")
    redact_logs(profile.api_key for profile in settings.providers.values())  # after uvicorn's set-up
    return config


def serve_worker(args: argparse.Namespace, settings: Settings, host: str, port: int) -> None:
    """One worker of ``--workers``: the whole server on the socket its supervisor bound."""
    settings, app = build_app(settings, host, port)
    config = uvicorn_config(app, settings, args.log_level, [(WORKER_HEADER, str(args.worker_index))])
    sock = socket.socket(fileno=args.worker_socket)
    WorkerServer(config, app, args.worker_index).run(sockets=[sock])


def refuse_exposure(host: str, auth_token: str, insecure: bool, mode: str = "") -> None:
    problem = exposure_problem(host, auth_token, mode)
    if problem is None:
        return
    if not insecure:
        print(f"meterchat: {problem}", file=sys.stderr)
        raise SystemExit(2)
    print(f"meterchat: WARNING: --insecure-no-auth: serving {host} with NO authentication; anyone who "
          "can reach this address can read every conversation and spend your provider keys",
          file=sys.stderr, flush=True)
